#!/usr/bin/env node
// hftok_ref.mjs - the reference side of tests/run_hftok_parity.sh: the npm packages
// llama-tokenizer-js (Llama 2), mistral-tokenizer-js (Mistral) and llama3-tokenizer-js
// (Llama 3), installed under NPMDIR/node_modules. MODEL is llama2, mistral or llama3.
//
//   node hftok_ref.mjs export  MODEL NPMDIR OUT.json      the package's vocabulary and merges
//                                                         as a Hugging Face tokenizer.json
//   node hftok_ref.mjs encode  MODEL NPMDIR INPUT OUT     ids of INPUT (no BOS/EOS), one a line
//   node hftok_ref.mjs decode  MODEL NPMDIR IDS OUT       the package's decode of the ids
//   node hftok_ref.mjs text    INPUT OUT                  INPUT as the packages read it (UTF-8,
//                                                         invalid bytes as U+FFFD)
//   node hftok_ref.mjs compare MODEL NPMDIR REF DT        first difference of two id files
//
// The files are written as the Hugging Face hub's are for these models: Llama 2 with the
// Prepend + Replace normalizer, Mistral with the newer Metaspace pre-tokenizer (prepend_scheme
// "first"), Llama 3 with the Split + ByteLevel pre-tokenizer and ignore_merges. Merge ranks
// are the packages' (their Map's values); the packages key merges by "a b", so a key is cut
// where both sides and their concatenation are tokens (exactly one such cut, or it fails).
//
// Added tokens: Hugging Face's tokenizers cut them out of the text before the model sees it.
// llama3-tokenizer-js does the same; the SentencePiece packages do not, so for them encode
// cuts "<unk>", "<s>", "</s>" out here and encodes the text between with the package
// (Llama 2: each part gets the prepended space, as its Prepend normalizer does; Mistral: only
// a part at the start of the text, as prepend_scheme "first").
import fs from 'fs';
import path from 'path';

const LLAMA3_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const FILES = {
  llama2: ['llama-tokenizer-js', 'llama-tokenizer.js', '1.2.2'],
  mistral: ['mistral-tokenizer-js', 'mistral-tokenizer.js', '1.0.0'],
  llama3: ['llama3-tokenizer-js', 'bundle/llama3-tokenizer-with-baked-data.js', '1.2.0'],
};

async function load(model, npmdir) {
  const f = FILES[model];
  if (!f) throw new Error(`unknown model ${model} (llama2, mistral or llama3)`);
  const dir = path.join(npmdir, 'node_modules', f[0]);
  const version = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'))).version;
  if (version !== f[2]) throw new Error(`${dir}: version ${version}, expected ${f[2]}`);
  return (await import(path.resolve(dir, f[1]))).default;
}

const SPM_ADDED = ['<unk>', '<s>', '</s>'];

function orderedMerges(tok) {
  const entries = [...tok.merges.entries()].sort((a, b) => a[1] - b[1]);
  const out = [];
  for (const [key] of entries) {
    let cut = null;
    for (let i = key.indexOf(' '); i >= 0; i = key.indexOf(' ', i + 1)) {
      const a = key.slice(0, i), b = key.slice(i + 1);
      if (tok.vocabByString.has(a) && tok.vocabByString.has(b) && tok.vocabByString.has(a + b)) {
        if (cut) throw new Error(`merge ${JSON.stringify(key)} can be cut in two places`);
        cut = [a, b];
      }
    }
    if (!cut) throw new Error(`merge ${JSON.stringify(key)} is not two tokens`);
    out.push(cut);
  }
  return out;
}

const added = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const template = (bos, id) => ({
  type: 'TemplateProcessing',
  single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
  pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
         { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
  special_tokens: { [bos]: { id: bos, ids: [id], tokens: [bos] } },
});

function exportJson(model, tok) {
  const merges = orderedMerges(tok);
  const vocab = {};
  if (model === 'llama3') {
    const nbase = tok.vocabById.length - 256;
    for (let i = 0; i < nbase; i++) vocab[tok.vocabById[i]] = i;
    return {
      version: '1.0', truncation: null, padding: null,
      added_tokens: tok.vocabById.slice(nbase).map((c, k) => added(nbase + k, c)),
      normalizer: null,
      pre_tokenizer: { type: 'Sequence', pretokenizers: [
        { type: 'Split', pattern: { Regex: LLAMA3_PATTERN }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
      post_processor: { type: 'Sequence', processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        template('<|begin_of_text|>', tok.vocabByString.get('<|begin_of_text|>'))] },
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
               end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
               vocab, merges },
    };
  }
  tok.vocabById.forEach((s, i) => { vocab[s] = i; });
  const spm = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: SPM_ADDED.map((c) => added(tok.vocabByString.get(c), c)),
    post_processor: template('<s>', tok.vocabByString.get('<s>')),
    decoder: { type: 'Sequence', decoders: [
      { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' }, { type: 'ByteFallback' },
      { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
             vocab, merges: merges.map(([a, b]) => `${a} ${b}`) },
  };
  if (model === 'llama2') {
    spm.normalizer = { type: 'Sequence', normalizers: [
      { type: 'Prepend', prepend: '\u2581' }, { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] };
    spm.pre_tokenizer = null;
  } else {
    spm.normalizer = null;
    spm.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false };
  }
  return spm;
}

function encode(model, tok, text) {
  if (model === 'llama3') return tok.encode(text, { bos: false, eos: false });
  const ids = [];
  const re = /<unk>|<s>|<\/s>/g;
  let prev = 0;
  const part = (s, at) => {
    if (s.length === 0) return;
    const prepend = model === 'llama2' || at === 0;
    for (const id of tok.encode(s, false, prepend)) ids.push(id);
  };
  for (const m of text.matchAll(re)) {
    part(text.slice(prev, m.index), prev);
    ids.push(tok.vocabByString.get(m[0]));
    prev = m.index + m[0].length;
  }
  part(text.slice(prev), prev);
  return ids;
}

const decode = (model, tok, ids) => model === 'llama3' ? tok.decode(ids) : tok.decode(ids, false, true);
const readIds = (f) => fs.readFileSync(f, 'utf8').split('\n').filter((l) => l !== '').map(Number);

async function main() {
  const [mode, model, npmdir, a, b] = process.argv.slice(2);
  if (mode === 'text') { // here model, npmdir are INPUT, OUT
    fs.writeFileSync(npmdir, Buffer.from(fs.readFileSync(model, 'utf8'), 'utf8'));
    return 0;
  }
  const tok = await load(model, npmdir);
  if (mode === 'export') {
    fs.writeFileSync(a, JSON.stringify(exportJson(model, tok), null, 1));
    return 0;
  }
  if (mode === 'encode') {
    const text = fs.readFileSync(a, 'utf8');
    const t0 = process.hrtime.bigint();
    const ids = encode(model, tok, text);
    const sec = Number(process.hrtime.bigint() - t0) / 1e9;
    fs.writeFileSync(b, ids.join('\n') + '\n');
    console.log(`reference ${model}: ${Buffer.byteLength(text)} bytes -> ${ids.length} tokens in ${sec.toFixed(1)} s`);
    return 0;
  }
  if (mode === 'decode') {
    fs.writeFileSync(b, Buffer.from(decode(model, tok, readIds(a)), 'utf8'));
    return 0;
  }
  if (mode === 'compare') {
    const ref = readIds(a), got = readIds(b);
    let i = 0;
    while (i < ref.length && i < got.length && ref[i] === got[i]) i++;
    if (i === ref.length && i === got.length) {
      console.log(`ids identical: ${ref.length} tokens`);
      return 0;
    }
    const n = tok.vocabById.length;
    const show = (ids) => JSON.stringify(ids.filter((x) => x >= 0 && x < n).map((x) => tok.vocabById[x]));
    const lo = Math.max(0, i - 8);
    console.log(`FIRST MISMATCH at token ${i} of ${ref.length} (dtrain has ${got.length})`);
    console.log(`  before:    ${show(ref.slice(lo, i))}`);
    console.log(`  reference: [${ref.slice(i, i + 8).join(', ')}] = ${show(ref.slice(i, i + 8))}`);
    console.log(`  dtrain:    [${got.slice(i, i + 8).join(', ')}] = ${show(got.slice(i, i + 8))}`);
    return 1;
  }
  console.error('usage: node hftok_ref.mjs export|encode|decode|compare MODEL NPMDIR ... | text INPUT OUT');
  return 2;
}

process.exitCode = await main();
