// A Node.js http server (run by /usr/bin/node in its tenant's sandbox). It listens on ELASTIC_LISTEN
// ("unix:PATH") and answers GET / with what it sees from inside the sandbox, as view.py does for the Python apps:
// the pids in /proc, whether each of $OTHER_ROOTS exists, its own root (its working directory), /tmp writable.
"use strict";

const fs = require("fs");
const http = require("http");
const os = require("os");
const path = require("path");

const listen = process.env.ELASTIC_LISTEN || "";
if (!listen.startsWith("unix:")) {
  console.error(`ELASTIC_LISTEN is not unix:PATH: ${JSON.stringify(listen)}`);
  process.exit(2);
}

function observe() {
  let tmpWritable = false;
  try {
    const dir = fs.mkdtempSync(path.join("/tmp", "node-probe-"));
    fs.rmdirSync(dir);
    tmpWritable = true;
  } catch (err) {
    tmpWritable = false;
  }
  const others = {};
  for (const other of (process.env.OTHER_ROOTS || "").split(":").filter(Boolean)) {
    others[other] = fs.existsSync(other);
  }
  return {
    app: "node",
    uid: process.getuid(),
    pid: process.pid,
    pids: fs.readdirSync("/proc").filter((name) => /^\d+$/.test(name)).map(Number).sort((a, b) => a - b),
    others,
    cwd: process.cwd(),
    own_root: fs.existsSync(process.cwd()),
    tmp_writable: tmpWritable,
    node: process.version,
    hostname: os.hostname(),
  };
}

const server = http.createServer((req, res) => {
  const body = JSON.stringify(observe());
  res.writeHead(200, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
  res.end(body);
});
server.listen(listen.slice("unix:".length));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
