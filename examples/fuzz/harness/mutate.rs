//! Seeded mutations shared by every target: token swaps and splices between corpus files for
//! text, bit flips and truncations for bytes, and the hostile values every parser should meet
//! (boundary numbers, deep nesting, long lines, control characters, invalid UTF-8).
//!
//! Everything is a function of the [`Rng`] passed in, so an input is a function of the seed and
//! its index.

use rumus::rng::Rng;

/// Largest input a mutation may grow to (bytes); longer results are truncated.
pub const MAX_INPUT: usize = 1 << 20;

/// Numbers at the edges of every integer and float type a loader might convert to.
pub const BOUNDARY_NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "7",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "-2147483648",
    "-2147483649",
    "4294967295",
    "4294967296",
    "4294967297",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999",
    "0.0",
    "-0.0",
    "0.5",
    "1.5",
    "1e-45",
    "1e-300",
    "3.4028235e38",
    "3.5e38",
    "1e39",
    "-1e39",
    "1e308",
    "1e309",
    "1e999",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "infinity",
    "0x7fffffff",
    "0b1",
    "1_000",
    "1e",
    ".",
    "-",
];

/// Characters a terminal or a log would misread when printed raw.
pub const CONTROL: &[&str] = &[
    "\0",
    "\x07",
    "\x08",
    "\x0b",
    "\x0c",
    "\r",
    "\r\n",
    "\x1b[31m",
    "\x1b]0;x\x07",
    "\x7f",
    "\u{85}",
    "\u{9b}",
    "\u{202e}",
    "\u{2028}",
    "\u{feff}",
    "\u{200b}",
    "\t",
];

/// Byte sequences that are not UTF-8.
pub const INVALID_UTF8: &[&[u8]] = &[
    b"\xff",
    b"\xc0\xaf",
    b"\x80",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xfe\xfe",
];

/// Openers and closers for deep nesting.
const NESTING: &[(&str, &str)] =
    &[("(", ")"), ("[", "]"), ("{", "}"), ("relu(", ")"), ("-", ""), ("#{a:", "}"), ("[1,", "]")];

/// How deep nests go, and how long long lines get.
const DEPTHS: &[usize] = &[8, 40, 65, 129, 257, 1_000, 10_000, 100_000];
const LENGTHS: &[usize] = &[80, 300, 1_000, 5_000, 70_000];

/// A mutator over one target's corpus and dictionary.
pub struct Mutator<'a> {
    pub corpus: &'a [Vec<u8>],
    /// Tokens of the target's language (keywords, API names, option keys, punctuation).
    pub dict: &'a [&'a str],
}

impl Mutator<'_> {
    /// A corpus file, mutated 1 to 8 times (geometrically fewer), sometimes crossed with another.
    pub fn text(&self, rng: &mut Rng) -> Vec<u8> {
        let mut buf = self.pick(rng).to_vec();
        if rng.below(10) == 0 {
            self.splice(rng, &mut buf);
        }
        let mut n = 1;
        while n < 8 && rng.below(2) == 0 {
            n += 1;
        }
        for _ in 0..n {
            self.text_once(rng, &mut buf);
        }
        buf.truncate(MAX_INPUT);
        buf
    }

    /// A corpus file with byte-level damage only.
    pub fn bytes(&self, rng: &mut Rng) -> Vec<u8> {
        let mut buf = self.pick(rng).to_vec();
        let n = 1 + rng.below(4);
        for _ in 0..n {
            self.bytes_once(rng, &mut buf);
        }
        buf.truncate(MAX_INPUT);
        buf
    }

    pub fn pick(&self, rng: &mut Rng) -> &[u8] {
        &self.corpus[rng.below(self.corpus.len() as u64) as usize]
    }

    /// One structure-aware text mutation.
    pub fn text_once(&self, rng: &mut Rng, buf: &mut Vec<u8>) {
        let toks = tokens(buf);
        match rng.below(20) {
            0..=5 if !toks.is_empty() => {
                let (a, b) = toks[rng.below(toks.len() as u64) as usize];
                let numeric = buf[a].is_ascii_digit();
                let with = self.replacement(rng, buf, &toks, numeric);
                buf.splice(a..b, with);
            }
            6 if !toks.is_empty() => {
                let (a, b) = toks[rng.below(toks.len() as u64) as usize];
                buf.drain(a..b);
            }
            7 if toks.len() >= 2 => {
                let i = rng.below(toks.len() as u64) as usize;
                let j = rng.below(toks.len() as u64) as usize;
                let (x, y) = (toks[i.min(j)], toks[i.max(j)]);
                if x.1 <= y.0 {
                    let second = buf[y.0..y.1].to_vec();
                    let first = buf[x.0..x.1].to_vec();
                    buf.splice(y.0..y.1, first);
                    buf.splice(x.0..x.1, second);
                }
            }
            8 => {
                let at = self.position(rng, buf);
                let t = self.dict[rng.below(self.dict.len() as u64) as usize];
                buf.splice(at..at, format!(" {t} ").into_bytes());
            }
            9 => self.splice(rng, buf),
            10 => {
                // Deep nesting around a range of tokens.
                let (open, close) = NESTING[rng.below(NESTING.len() as u64) as usize];
                let depth = DEPTHS[rng.below(DEPTHS.len() as u64) as usize];
                let (a, b) = self.range(rng, buf, &toks);
                buf.splice(b..b, close.repeat(depth).into_bytes());
                buf.splice(a..a, open.repeat(depth).into_bytes());
            }
            11 => {
                // A long line: one token or character repeated.
                let unit = match rng.below(3) {
                    0 => "a".to_string(),
                    1 => self.dict[rng.below(self.dict.len() as u64) as usize].to_string(),
                    _ => "1,".to_string(),
                };
                let n = LENGTHS[rng.below(LENGTHS.len() as u64) as usize] / unit.len().max(1);
                let at = self.position(rng, buf);
                buf.splice(at..at, unit.repeat(n).into_bytes());
            }
            12 => {
                let at = self.position(rng, buf);
                let c = CONTROL[rng.below(CONTROL.len() as u64) as usize];
                buf.splice(at..at, c.bytes());
            }
            13 => {
                let at = rng.below(buf.len() as u64 + 1) as usize;
                let bad = INVALID_UTF8[rng.below(INVALID_UTF8.len() as u64) as usize];
                buf.splice(at..at, bad.iter().copied());
            }
            14 => {
                let at = rng.below(buf.len() as u64 + 1) as usize;
                buf.truncate(at);
            }
            15 | 16 => line_op(rng, buf),
            17 if !toks.is_empty() => {
                let (a, _) = toks[rng.below(toks.len() as u64) as usize];
                let n = BOUNDARY_NUMBERS[rng.below(BOUNDARY_NUMBERS.len() as u64) as usize];
                buf.splice(a..a, n.bytes());
            }
            _ => self.bytes_once(rng, buf),
        }
    }

    /// One byte-level mutation.
    pub fn bytes_once(&self, rng: &mut Rng, buf: &mut Vec<u8>) {
        let len = buf.len() as u64;
        match rng.below(9) {
            0 | 1 if len > 0 => {
                let i = rng.below(len) as usize;
                buf[i] ^= 1 << rng.below(8);
            }
            2 if len > 0 => {
                let i = rng.below(len) as usize;
                buf[i] = [0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'0', b'-'][rng.below(8) as usize];
            }
            3 => buf.truncate(rng.below(len + 1) as usize),
            4 if len > 0 => {
                let a = rng.below(len) as usize;
                let b = (a + 1 + rng.below(16) as usize).min(buf.len());
                buf.drain(a..b);
            }
            5 if len > 0 => {
                let a = rng.below(len) as usize;
                let b = (a + 1 + rng.below(64) as usize).min(buf.len());
                let chunk = buf[a..b].to_vec();
                let at = rng.below(buf.len() as u64 + 1) as usize;
                buf.splice(at..at, chunk);
            }
            6 if len >= 8 => {
                // An integer field overwritten with a boundary value.
                let i = rng.below(len - 3) as usize;
                let v: u64 = [0, 1, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff, u64::MAX, 1 << 63]
                    [rng.below(7) as usize];
                let n = if rng.below(2) == 0 { 4 } else { 8 }.min(buf.len() - i);
                buf[i..i + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            7 => {
                let extra = 1 + rng.below(64) as usize;
                buf.extend((0..extra).map(|_| rng.next_u64() as u8));
            }
            _ => self.splice(rng, buf),
        }
    }

    /// Replace a range of `buf` with a range of another corpus file.
    pub fn splice(&self, rng: &mut Rng, buf: &mut Vec<u8>) {
        let other = self.pick(rng);
        let (c, d) = span(rng, other.len());
        let (a, b) = span(rng, buf.len());
        buf.splice(a..b, other[c..d].iter().copied());
    }

    fn replacement(
        &self,
        rng: &mut Rng,
        buf: &[u8],
        toks: &[(usize, usize)],
        num: bool,
    ) -> Vec<u8> {
        let roll = rng.below(100);
        if roll < 15 || (num && roll < 60) {
            BOUNDARY_NUMBERS[rng.below(BOUNDARY_NUMBERS.len() as u64) as usize].into()
        } else if roll < 70 {
            let (a, b) = toks[rng.below(toks.len() as u64) as usize];
            buf[a..b].to_vec()
        } else if roll < 90 {
            self.dict[rng.below(self.dict.len() as u64) as usize].into()
        } else {
            let other = self.pick(rng);
            let t = tokens(other);
            match t.get(rng.below(t.len().max(1) as u64) as usize) {
                Some(&(a, b)) => other[a..b].to_vec(),
                None => Vec::new(),
            }
        }
    }

    /// A position on a character boundary (anywhere in a non-UTF-8 buffer).
    fn position(&self, rng: &mut Rng, buf: &[u8]) -> usize {
        let mut at = rng.below(buf.len() as u64 + 1) as usize;
        while at > 0 && at < buf.len() && buf[at] & 0xc0 == 0x80 {
            at -= 1;
        }
        at
    }

    /// A range between token boundaries (or the whole buffer when it has no tokens).
    fn range(&self, rng: &mut Rng, buf: &[u8], toks: &[(usize, usize)]) -> (usize, usize) {
        if toks.is_empty() {
            return (0, buf.len());
        }
        let i = rng.below(toks.len() as u64) as usize;
        let j = (i + rng.below(6) as usize).min(toks.len() - 1);
        (toks[i].0, toks[j].1)
    }
}

/// A random range of a buffer of `len` bytes: short ranges far more often than long ones.
fn span(rng: &mut Rng, len: usize) -> (usize, usize) {
    let a = rng.below(len as u64 + 1) as usize;
    let max = [4usize, 32, 256, usize::MAX][rng.below(4) as usize];
    let n = rng.below((len - a).min(max) as u64 + 1) as usize;
    (a, a + n)
}

/// Delete, duplicate or swap whole lines.
fn line_op(rng: &mut Rng, buf: &mut Vec<u8>) {
    let mut lines: Vec<Vec<u8>> = buf.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
    let n = lines.len() as u64;
    let i = rng.below(n) as usize;
    match rng.below(3) {
        0 if n > 1 => {
            lines.remove(i);
        }
        1 => {
            let copy = lines[i].clone();
            let times = 1 + rng.below(3) as usize;
            for _ in 0..times {
                lines.insert(i, copy.clone());
            }
        }
        _ => {
            let j = rng.below(n) as usize;
            lines.swap(i, j);
        }
    }
    *buf = lines.join(&b'\n');
}

/// Token ranges: runs of word characters (letters, digits, `_`, `.` and non-ASCII bytes, so
/// numbers like `1.5e3` and multi-byte characters stay whole) and single punctuation bytes.
/// Whitespace is not a token.
pub fn tokens(buf: &[u8]) -> Vec<(usize, usize)> {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c >= 0x80;
    let mut out = Vec::new();
    let mut i = 0;
    while i < buf.len() {
        let c = buf[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if word(c) {
            let start = i;
            while i < buf.len() && word(buf[i]) {
                i += 1;
            }
            out.push((start, i));
        } else {
            out.push((i, i + 1));
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_keep_numbers_and_characters_whole() {
        let text = "x = 1.5e3 +é(y)";
        let toks: Vec<&str> = tokens(text.as_bytes()).iter().map(|&(a, b)| &text[a..b]).collect();
        assert_eq!(toks, ["x", "=", "1.5e3", "+", "é", "(", "y", ")"]);
    }
}
