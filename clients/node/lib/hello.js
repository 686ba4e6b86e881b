'use strict';
// The zygote's hello, which also says which optional features it offers.

const native = require('./native');

// Resolves with { protocolVersion, features, serverVersion }.
function hello() {
  return new Promise((resolve, reject) => {
    const id = native.register((kind, a, b, message) => {
      native.unref();
      if (kind === native.HELLO) resolve(JSON.parse(message));
      else reject(Object.assign(new Error(message), { errno: -a }));
    });
    native.ref();
    native.addon.hello(id);
  });
}

module.exports = { hello };
