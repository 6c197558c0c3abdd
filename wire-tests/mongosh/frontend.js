// mongosh against `sluice demo`: the shell must see a mongos and get answers to its start-up
// commands. Run by wire-tests/run.sh with `mongosh --quiet <uri> --file`.
const assert = require('assert');
let passed = 0;
function check(name, fn) {
  fn();
  passed += 1;
  print(`ok - ${name}`);
}

check('hello says isdbgrid', () => {
  const hello = db.hello();
  assert.strictEqual(hello.msg, 'isdbgrid');
  assert.strictEqual(hello.isWritablePrimary, true);
  assert.strictEqual(hello.maxWireVersion, 25);
});

check('ping', () => {
  assert.strictEqual(db.runCommand({ ping: 1 }).ok, 1);
});

check('buildInfo names MongoDB 8.0 and Sluice', () => {
  const info = db.adminCommand({ buildInfo: 1 });
  assert.ok(info.version.startsWith('8.0'), info.version);
  assert.ok(info.sluice.version.length > 0);
  assert.strictEqual(db.version(), info.version);
});

check('startup commands mongosh sends', () => {
  const fcv = db.adminCommand({ getParameter: 1, featureCompatibilityVersion: 1 });
  assert.strictEqual(fcv.featureCompatibilityVersion.version, '8.0');
  const log = db.adminCommand({ getLog: 'startupWarnings' });
  assert.strictEqual(log.log.length, 0);
  const status = db.serverStatus();
  assert.strictEqual(status.process, 'mongos');
});

check('unknown commands are CommandNotFound', () => {
  let err;
  try { db.runCommand({ noSuchCommand: 1 }); } catch (e) { err = e; }
  assert.ok(err, 'an error is thrown');
  assert.strictEqual(err.code, 59);
  assert.strictEqual(err.codeName, 'CommandNotFound');
});

// The prompt (`[direct: mongos] test>`) is checked by run.sh in an interactive session.

print(`mongosh frontend: ${passed} passed, 0 failed`);
