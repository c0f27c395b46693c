#!/usr/bin/env node
// gen_hftok_torture.js - writes the Unicode torture text of tests/run_hftok_parity.sh:
//   node tests/ref/gen_hftok_torture.js OUTPUT [KILOBYTES]
// A fixed list of hard fragments (combining marks, emoji ZWJ sequences, flags and keycaps, CJK,
// right-to-left scripts and bidi controls, control characters, invalid UTF-8 bytes: overlong
// forms, encoded surrogates, truncated sequences, stray continuation bytes, bytes past
// U+10FFFF; whitespace runs of every kind with CR/LF, digit runs of every length and script for
// Llama 3's \p{N}{1,3}, contractions in every case, special-token look-alikes and the real
// ones, the SentencePiece space mark itself, long runs), each once on its own line, then the
// fragments again in a seeded random order joined by random whitespace, to KILOBYTES (200).
'use strict';
const fs = require('fs');

const out = process.argv[2];
const kilobytes = Number(process.argv[3] || 200);
if (!out) {
  console.error('usage: node gen_hftok_torture.js OUTPUT [KILOBYTES]');
  process.exit(2);
}

let seed = 0x70c7a5e;
function rand() { // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];

const B = (...bytes) => Buffer.from(bytes);
const S = (s) => Buffer.from(s, 'utf8');
const fragments = [
  // combining marks, normalisation look-alikes
  S('e\u0301 é a\u0300\u0316\u0317 Z\u0351\u0352\u0353\u0354a\u0355\u0356l\u0357\u0358g\u0359o\u035a'),
  S('\u0915\u094d\u0937 \u0e01\u0e34\u0e19 \u1100\u1161\u11a8 \u0301\u0301\u0301 leading mark'),
  // emoji: ZWJ families, skin tones, flags, keycaps, variation selectors
  S('👩‍👩‍👧‍👦 👨🏽‍💻 🏳️‍🌈 🏴‍☠️ 👍🏽👍🏿 🇯🇵🇫🇷🇺🇳 1️⃣#️⃣*️⃣ ☺︎☺️ 🫠🫶'),
  S('🙂🙂🙂 😀x😀 a👍b 12🎉34'),
  // CJK and friends
  S('中文字符，日本語のテキスト、한국어 문장。「引用」『二重』〜ー'),
  S('漢字かなカナ混じり文 ＡＢＣ１２３ ｶﾀｶﾅ 𠀋𡈽𪚲'),
  // right to left, bidi controls
  S('العربية مع أرقام ١٢٣٤٥ و 67 و \u200fعلامة\u200e עברית עם ניקוד שָׁלוֹם'),
  S('\u202eevil\u202c \u2066isolate\u2069 \u061c\u200d\u200c'),
  // control characters and line separators
  B(0x00, 0x01, 0x02, 0x07, 0x08, 0x0b, 0x0c, 0x1b, 0x1f, 0x7f, 0x20, 0x41),
  S('a\u0085b\u2028c\u2029d\u000be\u000cf\u001cg'),
  // invalid UTF-8: stray bytes, overlong, surrogates, truncated, past U+10FFFF
  B(0x61, 0xff, 0x62, 0xfe, 0x63, 0x80, 0xbf, 0x64),
  B(0xc0, 0xaf, 0x20, 0xe0, 0x80, 0xaf, 0x20, 0xc1, 0xbf),
  B(0xed, 0xa0, 0x80, 0xed, 0xbf, 0xbf, 0x20, 0x78),
  B(0xe2, 0x82, 0x41, 0xf0, 0x9f, 0x98, 0x20, 0xf0, 0x9f, 0x41),
  B(0xf4, 0x90, 0x80, 0x80, 0xf5, 0x80, 0x20, 0xf8, 0x88, 0x80, 0x80, 0x80),
  B(0x27, 0xff, 0x73, 0x20, 0x31, 0xc3, 0x32, 0x0a, 0xe2, 0x0a),
  // whitespace runs, CR/LF mixtures, exotic spaces
  S('a  b   c    d\t\te \t \tf\n\ng\r\nh\r\r\ni \n \n j'),
  S('x\u00a0\u00a0y\u3000z\u2003\u2003w\u1680v \u00a0 u\u202f\u205ft'),
  S('   \n\n\n   \t\n \r\n\r\n  end'),
  S('\n \nline\n  \n\t\nline2   \n'),
  // digits for \p{N}{1,3}
  S('1 12 123 1234 12345 123456 1234567 0000000001 3.14159 1,000,000 -42 +7e10'),
  S('٣٤٥٦ ०१२३४ １２３４５ ①②③④ ⅫⅩⅣ ¼½¾ ²³¹ 𝟘𝟙𝟚𝟛 9️⃣ 12abc34def567'),
  // contractions in every case
  S("it's IT'S It'S don't DON'T we're WE'RE We'Re they've THEY'VE I'm I'M you'll YOU'LL yoU'lL he'd HE'D"),
  S("'s 'S 't 'T 're 'rE 've 'Ve 'm 'M 'll 'Ll 'd 'D 'x ''s '''t 's's ’s ’t 'ſ"),
  // special tokens, real and look-alike
  S('<|begin_of_text|>hello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>'),
  S('<|reserved_special_token_5|> <|reserved_special_token_247|><|reserved_special_token_248|> <|not_special|> <|eot_id| <|'),
  S('<s>begin</s> <unk> <s><s></s> <s x</s <un k>'),
  // the SentencePiece space mark itself, and look-alikes
  S('\u2581 \u2581\u2581word \u2581a_b __init__ ＿'),
  // letters of other planes, mathematical alphanumerics
  S('𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝 𐌰𐌱𐌲 𓀀𓀁 ǅungla ǈ ǋ Ꭰ ꙮ'),
  // code and punctuation runs
  S('int main(void) { return a->b[i++] << 2 >>= 3; } // ?!?!... ---> <=> ==='),
  S('https://example.com/a?b=c&d=e#f user@host.tld "quoted" \'single\' `tick`'),
  // long runs
  S('a'.repeat(700) + ' ' + '='.repeat(300) + ' ' + '9'.repeat(100) + ' ' + ' '.repeat(50) + 'z'),
  S('ab'.repeat(200) + '\n' + '🙂'.repeat(64) + '\n' + '\u0301'.repeat(40)),
];
const glue = [' ', '  ', '\n', '\n\n', '\t', ' \n', '\r\n', '', '\u3000', ' \t '].map(S);

const parts = [];
for (const f of fragments) parts.push(f, S('\n'));
let size = parts.reduce((n, p) => n + p.length, 0);
while (size < kilobytes * 1024) {
  const f = pick(fragments), g = pick(glue);
  parts.push(f, g);
  size += f.length + g.length;
}
fs.writeFileSync(out, Buffer.concat(parts));
