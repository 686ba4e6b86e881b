'use strict';
// `node -r zygote/register app.js`: the app's child_process.spawn,
// execFile and exec go through the zygote, unchanged.
require('./index').install();
