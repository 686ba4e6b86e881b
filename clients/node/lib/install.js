'use strict'; module.exports = { install() {}, uninstall() {} };
