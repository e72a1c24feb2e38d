/**
 * Vitest configuration for the Durable Streams conformance suite.
 *
 * The suite ships as a test file inside node_modules
 * (@durable-streams/server-conformance-tests/dist/test-runner.js), which Vitest's default
 * include/exclude globs never pick up, so it is named explicitly here. The server under test
 * is given by the CONFORMANCE_TEST_URL environment variable, as the package's own CLI does;
 * run.mjs sets it. Timeouts are Vitest's defaults, as with the package's CLI.
 */
import { createRequire } from "node:module"
import { dirname, join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

const here = dirname(fileURLToPath(import.meta.url))
const require = createRequire(import.meta.url)
const packageDir = dirname(
  require.resolve(`@durable-streams/server-conformance-tests/package.json`)
)
const testRunner = relative(here, join(packageDir, `dist`, `test-runner.js`))

export default defineConfig({
  root: here,
  test: {
    include: [testRunner],
    exclude: [],
    passWithNoTests: false,
    watch: false,
  },
})
