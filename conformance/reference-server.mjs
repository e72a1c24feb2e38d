#!/usr/bin/env node
/**
 * The Durable Streams Node reference server (@durable-streams/server), file-backed,
 * on 127.0.0.1. Used to validate the conformance harness and as a benchmark baseline.
 *
 * Usage:
 *   node conformance/reference-server.mjs --port <port> --data-dir <dir>
 *       [--host 127.0.0.1] [--long-poll-timeout <ms>]
 *
 * --port 0 picks a free port. Once listening, the server prints one line to stdout,
 *   listening http://127.0.0.1:<port>
 * and serves streams under /v1/stream/. Without --data-dir the store is in memory.
 * SIGTERM or SIGINT stops it cleanly (the file store is closed) with exit code 0.
 */

import { mkdirSync } from "node:fs"
import { resolve } from "node:path"
import { parseArgs } from "node:util"
import { DurableStreamTestServer } from "@durable-streams/server"

function usage(message) {
  if (message) console.error(`reference-server: ${message}`)
  console.error(
    `usage: node reference-server.mjs --port <port> --data-dir <dir> ` +
      `[--host 127.0.0.1] [--long-poll-timeout <ms>]`
  )
  process.exit(2)
}

let values
try {
  ;({ values } = parseArgs({
    options: {
      port: { type: `string` },
      "data-dir": { type: `string` },
      host: { type: `string`, default: `127.0.0.1` },
      "long-poll-timeout": { type: `string` },
      help: { type: `boolean`, short: `h` },
    },
    strict: true,
  }))
} catch (err) {
  usage(err.message)
}
if (values.help) usage()
if (values.port === undefined) usage(`--port is required (0 picks a free port)`)

const port = Number(values.port)
if (!Number.isInteger(port) || port < 0 || port > 65535) usage(`bad --port ${values.port}`)

const options = { port, host: values.host }
if (values["data-dir"] !== undefined) {
  options.dataDir = resolve(values["data-dir"])
  mkdirSync(options.dataDir, { recursive: true })
}
if (values["long-poll-timeout"] !== undefined) {
  const ms = Number(values["long-poll-timeout"])
  if (!Number.isInteger(ms) || ms <= 0) usage(`bad --long-poll-timeout ${values["long-poll-timeout"]}`)
  options.longPollTimeout = ms
}

const server = new DurableStreamTestServer(options)
await server.start()
console.log(`listening ${server.url}`)

let stopping = false
async function shutdown(signal) {
  if (stopping) return
  stopping = true
  try {
    await server.stop()
    process.exit(0)
  } catch (err) {
    console.error(`reference-server: error while stopping on ${signal}: ${err.message}`)
    process.exit(1)
  }
}
process.on(`SIGTERM`, () => shutdown(`SIGTERM`))
process.on(`SIGINT`, () => shutdown(`SIGINT`))
