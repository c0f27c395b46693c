#!/usr/bin/env node
// bpe_ref.js - the reference side of tests/run_bpe_parity.sh: the npm package gpt-3-encoder
// (1.1.4), installed under PREFIX/node_modules.
//
//   node bpe_ref.js encode  PREFIX INPUT OUTPUT   ids of INPUT (UTF-8), one per line
//   node bpe_ref.js pieces  PREFIX INPUT OUTPUT   the regex's matches: UTF-8 byte lengths
//   node bpe_ref.js compare PREFIX INPUT REF DT   first difference of two id files, in context
//   node bpe_ref.js compare-pieces PREFIX INPUT REF DT   the same for two piece files
//
// The package's encode() grows its result with Array.concat, quadratic on megabytes, so the
// loop below repeats encode() statement for statement with the package's own regex, byte
// map, bpe() and encoder, pushing ids instead. Before the whole file it checks that the two
// agree on the file's first 64 KB.
'use strict';
const fs = require('fs');
const path = require('path');
const Module = require('module');

function loadPackage(prefix) {
  const file = path.join(prefix, 'node_modules', 'gpt-3-encoder', 'Encoder.js');
  const version = JSON.parse(fs.readFileSync(path.join(path.dirname(file), 'package.json'))).version;
  if (version !== '1.1.4') throw new Error(`${file}: version ${version}, expected 1.1.4`);
  // Compile the package's file as it is, plus one line that exports its internals.
  const src = fs.readFileSync(file, 'utf8') +
    '\nmodule.exports.__internals = { bpe, encoder, byte_encoder, pat, encodeStr };\n';
  const m = new Module(file, module);
  m.filename = file;
  m.paths = Module._nodeModulePaths(path.dirname(file));
  m._compile(src, file);
  return m.exports;
}

function encodeAll(pkg, text) {
  const { bpe, encoder, byte_encoder, pat, encodeStr } = pkg.__internals;
  const ids = [];
  for (const match of text.matchAll(pat)) {
    const token = encodeStr(match[0]).map((x) => byte_encoder[x]).join('');
    for (const piece of bpe(token).split(' ')) {
      const id = encoder[piece];
      if (typeof id !== 'number') throw new Error(`reference produced no id for ${JSON.stringify(piece)}`);
      ids.push(id);
    }
  }
  return ids;
}

const readIds = (f) => fs.readFileSync(f, 'utf8').split('\n').filter((l) => l !== '').map(Number);

function main() {
  const [mode, prefix, input, a, b] = process.argv.slice(2);
  const pkg = loadPackage(prefix);
  const text = fs.readFileSync(input, 'utf8');
  if (mode === 'encode') {
    // The sample must end on a code point: cut before a low surrogate would split a pair.
    let cut = Math.min(text.length, 65536);
    if (cut < text.length && /[\udc00-\udfff]/.test(text[cut])) cut--;
    const sample = text.slice(0, cut);
    const viaPackage = pkg.encode(sample), viaLoop = encodeAll(pkg, sample);
    if (viaPackage.length !== viaLoop.length || viaPackage.some((x, i) => x !== viaLoop[i]))
      throw new Error('the harness loop disagrees with the package encode() on the sample');
    const t0 = process.hrtime.bigint();
    const ids = encodeAll(pkg, text);
    const sec = Number(process.hrtime.bigint() - t0) / 1e9;
    fs.writeFileSync(a, ids.join('\n') + '\n');
    console.log(`reference: ${Buffer.byteLength(text)} bytes -> ${ids.length} tokens in ${sec.toFixed(1)} s`);
    return 0;
  }
  if (mode === 'pieces') {
    const { pat } = pkg.__internals;
    const lens = [];
    for (const match of text.matchAll(pat)) lens.push(Buffer.byteLength(match[0]));
    fs.writeFileSync(a, lens.join('\n') + '\n');
    console.log(`reference: ${lens.length} pieces`);
    return 0;
  }
  if (mode === 'compare-pieces') {
    const ref = readIds(a), got = readIds(b);
    let i = 0, at = 0;
    while (i < ref.length && i < got.length && ref[i] === got[i]) at += ref[i++];
    if (i === ref.length && i === got.length) {
      console.log(`pieces identical: ${ref.length} pieces`);
      return 0;
    }
    const bytes = Buffer.from(text, 'utf8');
    const cut = (lens) => {
      const out = [];
      for (let k = 0, p = at; k < 4 && k < lens.length; p += lens[k++])
        out.push(bytes.subarray(p, p + lens[k]).toString('utf8'));
      return JSON.stringify(out);
    };
    console.log(`FIRST PIECE MISMATCH at piece ${i}, byte ${at}`);
    console.log(`  text before: ${JSON.stringify(bytes.subarray(Math.max(0, at - 40), at).toString('utf8'))}`);
    console.log(`  reference:   ${cut(ref.slice(i))}`);
    console.log(`  dtrain:      ${cut(got.slice(i))}`);
    return 1;
  }
  if (mode === 'compare') {
    const ref = readIds(a), got = readIds(b);
    let i = 0;
    while (i < ref.length && i < got.length && ref[i] === got[i]) i++;
    if (i === ref.length && i === got.length) {
      console.log(`ids identical: ${ref.length} tokens`);
      return 0;
    }
    const show = (ids) => JSON.stringify(pkg.decode(ids));
    const lo = Math.max(0, i - 8);
    console.log(`FIRST MISMATCH at token ${i} of ${ref.length} (dtrain has ${got.length})`);
    console.log(`  text before: ${show(ref.slice(lo, i))}`);
    console.log(`  reference:   [${ref.slice(i, i + 8).join(', ')}] = ${show(ref.slice(i, i + 8))}`);
    console.log(`  dtrain:      [${got.slice(i, i + 8).join(', ')}] = ${show(got.slice(i, i + 8).filter((x) => x >= 0 && x < 50257))}`);
    return 1;
  }
  console.error('usage: node bpe_ref.js encode|pieces PREFIX INPUT OUTPUT | compare|compare-pieces PREFIX INPUT REF DT');
  return 2;
}

process.exitCode = main();
