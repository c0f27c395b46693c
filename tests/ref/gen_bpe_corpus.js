#!/usr/bin/env node
// gen_bpe_corpus.js - writes the deterministic text that tests/run_bpe_parity.sh encodes with
// the reference (gpt-3-encoder) and with dtrain:
//   node tests/ref/gen_bpe_corpus.js OUTPUT [MEGABYTES]
// Parts: real English (Debian's /usr/share/common-licenses, if present); paragraphs mixing
// many scripts, emoji sequences, whitespace of every kind, numbers, contractions in both
// cases, punctuation runs, code, URLs; a sweep of the BMP and plane 1 (and a sample of the
// other planes) that puts every code point between a letter and a digit, so that each one's
// class decides the pieces; and long runs that exercise BPE on long pieces.
'use strict';
const fs = require('fs');
const path = require('path');

const out = process.argv[2];
const megabytes = Number(process.argv[3] || 3);
if (!out) {
  console.error('usage: node gen_bpe_corpus.js OUTPUT [MEGABYTES]');
  process.exit(2);
}

// mulberry32: a small PRNG with a fixed seed, so the corpus is the same on every run.
let seed = 0x5eed1234;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const randint = (n) => Math.floor(rand() * n);
const pick = (a) => a[randint(a.length)];

const words = {
  english: ('the of and to in is was for that with as on by at from this be are have not ' +
    'but or an which were had their one all been there would will more can when who so ' +
    'if what about into than them only other time some could these two may then first any ' +
    'Hello World GPT Transformer OpenAI London Monday January NASA iPhone McDonald ' +
    'tokenizer training gradient attention layer embedding dataset checkpoint').split(' '),
  latin: ('café naïve über straße Straße niño łódź Việt Nguyễn ångström façade crème brûlée ' +
    'résumé coöperate São Paulo Ærø Øresund ğüşıöç İstanbul Ελλάδα żółć Dvořák Kraków ' +
    'Ðóttir þorn ĳssel ﬁnance ǅemal').split(' '),
  greek: 'αλφάβητο Ελληνικά καλημέρα φιλοσοφία ΑΘΗΝΑ λόγος ψυχή ζωή Ωμέγα'.split(' '),
  cyrillic: 'Привет мир русский язык Україна ёжик Ёлка Москва България Србија'.split(' '),
  cjk: ('中文 日本語 漢字 ひらがな カタカナ 한국어 こんにちは世界 ＡＢＣ１２３ 我们的 東京都 ' +
    '学习机器 ｶﾀｶﾅ 〇一二三 北京欢迎你').split(' '),
  arabic: 'مرحبا العربية السلام عليكم ٠١٢٣٤٥٦٧٨٩ שלום עברית فارسی'.split(' '),
  indic: 'नमस्ते हिन्दी संस्कृतम् ०१२३ தமிழ் বাংলা ภาษาไทย ქართული Հայերեն ኢትዮጵያ'.split(' '),
  astral: '𝐀𝐁𝐂 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁𪚥 𐌰𐌱𐌲 𝟘𝟙𝟚 𓀀𓁐 𝒜𝒷𝒸 e\u0301 a\u0308o\u0308'.split(' '),
  emoji: ['😀', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '❤️', '1️⃣', '🇺🇸', '🇯🇵', '👩🏿‍💻', '🤷‍♀️', '🙂🙃',
    '✅', '🚀🚀🚀', '©', '™', '\u200d', '\ufe0f', '🫠', '🧑🏻‍🤝‍🧑🏾'],
  numbers: ['0', '7', '42', '1999', '2024', '3.14159', '1,000,000', '1e-9', '0x1F', '²³', '½',
    'Ⅻ', '①②', '٣', '१२', '10%', '$5.99', '-273.15', '007', '1st', '2nd', '3rd'],
  contractions: ["it's", "IT'S", "don't", "DON'T", "we're", "WE'RE", "I've", "I'VE", "I'm",
    "I'M", "you'll", "YOU'LL", "he'd", "HE'D", "'s", "'tis", "rock 'n' roll", "o'clock",
    "it’s", "''", "'''s", " 's", "'ll'll", "'S", "'T", "'Re", "'rE", "dogs'", "'x", "'1",
    "can't've", "'d've", "y'all'd've"],
  punct: ['!', '!!!', '?!', '...', '---', '***', '#####', '$$$', '@@@', '<<>>', '«»', '“”', '—',
    '…', '(((', ')))', '{}[]', '::', ';;', '~~~', '^^^', '|||', '\\\\', '", "', '.",', '?"',
    '<|endoftext|>', '< | endoftext | >', '<|im_start|>'],
  code: ['int main(void) {', '    return 0;', '}', 'for (i = 0; i < n; i++) x[i] += y[i];',
    'def f(x):\n\treturn x ** 2', 'const a = [1, 2, 3].map((v) => v * 2);',
    '{"key": "value", "n": 12}', '<div class="x">&nbsp;</div>', 'SELECT * FROM t WHERE id=1;',
    'https://example.com/path?q=1&r=2#frag', 'user@example.org', '/usr/local/bin/python3',
    'C:\\Windows\\System32', '#include <stdio.h>', '    if x != None and y >= 0:',
    '// TODO: fix me', '/* comment */', 'a_b_c = x->y.z', 'git commit -m "msg"'],
};
const categories = Object.keys(words);
const weights = { english: 12, latin: 3, greek: 2, cyrillic: 2, cjk: 3, arabic: 2, indic: 2,
  astral: 1, emoji: 2, numbers: 3, contractions: 3, punct: 2, code: 2 };
const weighted = [];
for (const c of categories) for (let k = 0; k < weights[c]; k++) weighted.push(c);

// Separators: mostly one space; every other JS whitespace (and some look-alikes that are
// not \s: U+0085, U+180E, U+200B) in runs.
const seps = [' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', '', '  ', '   ', '\t', ' \t', '\t\t',
  '\u00a0', '\u3000', '\u2028', '\u2003', '\u200b', '\ufeff', '\u0085', '\u180e', '\v', '\f',
  ' \u00a0 ', '\u2009\u2009', '\r', '    ', '\u202f', '\u205f', '\u1680'];
const lineEnds = ['\n', '\n', '\n', '\n', '\n', '\n\n', '\r\n', ' \n', '\n  ', '\n\n\n', '\n\t',
  '.\n', ' \n\n', '\u2029'];

function paragraph() {
  let s = '';
  const nlines = 1 + randint(8);
  for (let l = 0; l < nlines; l++) {
    const nwords = 1 + randint(16);
    for (let w = 0; w < nwords; w++) {
      if (w) s += pick(seps);
      let t = pick(words[pick(weighted)]);
      if (rand() < 0.1) t = t.toUpperCase();
      if (rand() < 0.05) t = t + pick(words.punct);
      if (rand() < 0.05) t = t + String(randint(100000));
      s += t;
    }
    s += pick(lineEnds);
  }
  return s;
}

// Every code point between 'x' and '1': its class shows in how the regex cuts "x?1".
function sweep() {
  const parts = [];
  const add = (cp) => {
    if (cp >= 0xd800 && cp <= 0xdfff) return;
    parts.push('x' + String.fromCodePoint(cp) + '1' + (parts.length % 24 === 23 ? '\n' : ' '));
  };
  for (let cp = 0; cp < 0x20000; cp++) add(cp);
  for (let cp = 0x20000; cp <= 0x10ffff; cp += 61) add(cp);
  return parts.join('');
}

function longRuns() {
  const letters = 'abcdefghijklmnopqrstuvwxyzéèαβγжщ';
  let s = '';
  s += 'a'.repeat(3000) + '\n' + 'ab'.repeat(1200) + '\n' + '9'.repeat(2000) + '\n';
  s += '!'.repeat(2000) + '\n' + ' '.repeat(700) + 'x\n' + '\n'.repeat(300) + 'y\n';
  s += Array.from({ length: 1500 }, () => letters[randint(letters.length)]).join('') + '\n';
  s += '中文字'.repeat(400) + '\n' + '😀'.repeat(300) + '\n' + ' \t'.repeat(300) + '\n';
  s += 'aaab'.repeat(500) + '\n' + '=-'.repeat(800) + '\n' + '0123456789'.repeat(150) + '\n';
  return s;
}

const chunks = [];
let size = 0;
const add = (s) => {
  chunks.push(s);
  size += Buffer.byteLength(s, 'utf8');
};

const licenses = '/usr/share/common-licenses';
if (fs.existsSync(licenses)) {
  for (const f of fs.readdirSync(licenses).sort()) {
    const p = path.join(licenses, f);
    if (fs.statSync(p).isFile()) add(fs.readFileSync(p, 'utf8'));
  }
}
add(sweep());
add(longRuns());
while (size < megabytes * 1e6) add(paragraph());
fs.writeFileSync(out, chunks.join(''));
console.log(`wrote ${size} bytes to ${out}`);
