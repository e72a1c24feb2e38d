#!/usr/bin/env node
/**
 * Runs the Durable Streams conformance suite (@durable-streams/server-conformance-tests)
 * against a running server and writes Vitest's JSON report.
 *
 * Usage:
 *   node conformance/run.mjs <base-url> [--output <file.json>] [-t <pattern>] [--quiet]
 *       [-- <extra vitest arguments>]
 *
 *   <base-url>     the server root; the suite requests <base-url>/v1/stream/...
 *   --output, -o   where the JSON report goes (default: <tmpdir>/durable-streams-conformance.json)
 *   -t, --grep     run only tests whose full name ("Describe > ... > test") matches the
 *                  regular expression; the others are reported as skipped
 *   --quiet, -q    the "dot" reporter on the console instead of Vitest's default one
 *   -- ...         anything after "--" goes to `vitest run` as is (e.g. --testTimeout=30000, --bail=1)
 *
 * The package's own CLI (dist/cli.js) cannot be used: it passes a fixed argument list
 * (--reporter=default, no JSON output) and, installed under node_modules, its test file is
 * excluded by Vitest's default globs. So this script runs Vitest directly, with
 * vitest.config.mjs naming the package's test-runner file, and passes the base URL the way
 * cli.js does: in the CONFORMANCE_TEST_URL environment variable.
 *
 * The exit code is Vitest's (0: every test that ran passed). A last line
 *   conformance: <n> passed, <n> failed, <n> skipped of <n> (<s> s); JSON report: <path>
 * summarises the report.
 */

import { spawn } from "node:child_process"
import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs"
import { createRequire } from "node:module"
import { constants, tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { parseArgs } from "node:util"

const here = dirname(fileURLToPath(import.meta.url))

function usage(message) {
  if (message) console.error(`run.mjs: ${message}`)
  console.error(
    `usage: node conformance/run.mjs <base-url> [--output <file.json>] [-t <pattern>] ` +
      `[--quiet] [-- <vitest arguments>]`
  )
  process.exit(2)
}

const argv = process.argv.slice(2)
const dashDash = argv.indexOf(`--`)
const ownArgs = dashDash === -1 ? argv : argv.slice(0, dashDash)
const vitestExtra = dashDash === -1 ? [] : argv.slice(dashDash + 1)

let values, positionals
try {
  ;({ values, positionals } = parseArgs({
    args: ownArgs,
    options: {
      output: { type: `string`, short: `o` },
      grep: { type: `string`, short: `t` },
      quiet: { type: `boolean`, short: `q` },
      help: { type: `boolean`, short: `h` },
    },
    allowPositionals: true,
    strict: true,
  }))
} catch (err) {
  usage(err.message)
}
if (values.help) usage()
if (positionals.length !== 1) usage(`exactly one base URL is required`)

let baseUrl
try {
  baseUrl = new URL(positionals[0])
} catch {
  usage(`invalid URL ${JSON.stringify(positionals[0])}`)
}
if (baseUrl.protocol !== `http:` && baseUrl.protocol !== `https:`) {
  usage(`the base URL must be http:// or https://`)
}
// The suite appends paths starting with "/", so no trailing slash.
const base = baseUrl.href.replace(/\/+$/, ``)

const require = createRequire(import.meta.url)
let vitestBin
try {
  vitestBin = join(dirname(require.resolve(`vitest/package.json`)), `vitest.mjs`)
} catch {
  console.error(
    `run.mjs: vitest is not installed; run \`npm ci\` in ${here} (or \`make conformance\`)`
  )
  process.exit(2)
}

const output = resolve(values.output ?? join(tmpdir(), `durable-streams-conformance.json`))
mkdirSync(dirname(output), { recursive: true })
rmSync(output, { force: true }) // a stale report must not pass for this run's

const args = [
  vitestBin,
  `run`,
  `--config`,
  join(here, `vitest.config.mjs`),
  `--no-coverage`,
  `--passWithNoTests=false`,
  `--reporter=${values.quiet ? `dot` : `default`}`,
  `--reporter=json`,
  `--outputFile.json=${output}`,
]
if (values.grep !== undefined) args.push(`-t`, values.grep)
args.push(...vitestExtra)

console.log(`Running the Durable Streams conformance suite against ${base}`)
const started = Date.now()
const child = spawn(process.execPath, args, {
  cwd: here,
  stdio: `inherit`,
  env: { ...process.env, CONFORMANCE_TEST_URL: base },
})

// Pass termination on to Vitest, so a caller's timeout does not leave it running.
for (const signal of [`SIGINT`, `SIGTERM`]) {
  process.on(signal, () => child.kill(signal))
}

child.on(`error`, (err) => {
  console.error(`run.mjs: could not start vitest: ${err.message}`)
  process.exit(2)
})

child.on(`close`, (code, signal) => {
  const seconds = ((Date.now() - started) / 1000).toFixed(1)
  if (existsSync(output)) {
    const report = JSON.parse(readFileSync(output, `utf8`))
    const skipped = report.numPendingTests + report.numTodoTests
    console.log(
      `conformance: ${report.numPassedTests} passed, ${report.numFailedTests} failed, ` +
        `${skipped} skipped of ${report.numTotalTests} (${seconds} s); JSON report: ${output}`
    )
  } else {
    console.log(`conformance: no JSON report was written (${seconds} s)`)
  }
  process.exit(code ?? 128 + (constants.signals[signal] ?? 0))
})
