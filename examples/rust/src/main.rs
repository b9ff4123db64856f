//! Read one data-parallel rank's micro-batches from an mmfs mount, with std only.
//!
//!     cargo run --release -- MOUNT SPLIT RANK [CONSUMED_SAMPLES]
//!
//! Everything comes from MOUNT/mmfs.json: `dtype`, `tokens_per_sample` and the
//! `training` section (micro_batch_size, data_parallel_size, rank_name_width,
//! microbatches[split], microbatch_name_width[split], ranks_path[split],
//! bytes_per_microbatch). Micro-batch j of rank r is
//! MOUNT/<ranks_path>/<r, rank_name_width digits>/<j, name width digits>.bin:
//! micro_batch_size samples of tokens_per_sample little-endian tokens.
//! A job resumed at consumed_samples starts at j = consumed / (mbs * dp).
//! Prints "j sum first last" per micro-batch.

use std::collections::BTreeMap;
use std::fs;
use std::process::exit;

/// The JSON values mmfs.json holds (a small parser, enough for that file).
#[derive(Debug)]
#[allow(dead_code)] // booleans and arrays are parsed, not read
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut map = BTreeMap::new();
                loop {
                    self.ws();
                    if self.s.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        return Ok(Json::Obj(map));
                    }
                    let key = match self.value()? {
                        Json::Str(k) => k,
                        _ => return Err("object key is not a string".into()),
                    };
                    self.ws();
                    if self.s.get(self.i) != Some(&b':') {
                        return Err("expected ':'".into());
                    }
                    self.i += 1;
                    let v = self.value()?;
                    map.insert(key, v);
                    self.ws();
                    if self.s.get(self.i) == Some(&b',') {
                        self.i += 1;
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.s.get(self.i) == Some(&b']') {
                        self.i += 1;
                        return Ok(Json::Arr(items));
                    }
                    items.push(self.value()?);
                    self.ws();
                    if self.s.get(self.i) == Some(&b',') {
                        self.i += 1;
                    }
                }
            }
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                while let Some(&c) = self.s.get(self.i) {
                    self.i += 1;
                    match c {
                        b'"' => return Ok(Json::Str(out)),
                        b'\\' => {
                            let e = *self.s.get(self.i).ok_or("bad escape")?;
                            self.i += 1;
                            match e {
                                b'n' => out.push('\n'),
                                b't' => out.push('\t'),
                                b'u' => {
                                    let hex = std::str::from_utf8(&self.s[self.i..self.i + 4]).map_err(|e| e.to_string())?;
                                    let code = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                                    out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                                    self.i += 4;
                                }
                                other => out.push(other as char),
                            }
                        }
                        _ => {
                            // copy one UTF-8 character
                            let start = self.i - 1;
                            let mut end = self.i;
                            while end < self.s.len() && (self.s[end] & 0xC0) == 0x80 {
                                end += 1;
                            }
                            out.push_str(std::str::from_utf8(&self.s[start..end]).map_err(|e| e.to_string())?);
                            self.i = end;
                        }
                    }
                }
                Err("unterminated string".into())
            }
            Some(_) => {
                let start = self.i;
                while self.i < self.s.len() && !b",}] \n\r\t".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
                match word {
                    "null" => Ok(Json::Null),
                    "true" => Ok(Json::Bool(true)),
                    "false" => Ok(Json::Bool(false)),
                    _ => word.parse::<f64>().map(Json::Num).map_err(|_| format!("bad value {word:?}")),
                }
            }
            None => Err("unexpected end".into()),
        }
    }
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.get(key),
            _ => None,
        }
    }
    fn int(&self, key: &str) -> Option<i64> {
        match self.get(key) {
            Some(Json::Num(n)) => Some(*n as i64),
            _ => None,
        }
    }
    fn string(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(Json::Str(s)) => Some(s),
            _ => None,
        }
    }
}

fn fail(message: &str) -> ! {
    eprintln!("mmfs-rank-reader: {message}");
    exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 || args.len() > 5 {
        fail("usage: mmfs-rank-reader MOUNT SPLIT RANK [CONSUMED_SAMPLES]");
    }
    let (mount, split) = (&args[1], &args[2]);
    let rank: i64 = args[3].parse().unwrap_or_else(|_| fail("RANK is not a number"));
    let consumed: i64 = args.get(4).map_or(Ok(0), |s| s.parse()).unwrap_or_else(|_| fail("bad CONSUMED_SAMPLES"));

    let text = fs::read(format!("{mount}/mmfs.json")).unwrap_or_else(|e| fail(&format!("mmfs.json: {e}")));
    let info = Parser { s: &text, i: 0 }.value().unwrap_or_else(|e| fail(&format!("mmfs.json: {e}")));
    let dtype = info.string("dtype").unwrap_or_else(|| fail("mmfs.json has no dtype"));
    let tokens = info.int("tokens_per_sample").unwrap_or_else(|| fail("mmfs.json has no tokens_per_sample"));
    let t = info.get("training").filter(|t| !matches!(t, Json::Null))
        .unwrap_or_else(|| fail("mmfs.json has no training section (add a training: block to the config)"));
    let need = |v: Option<i64>, what: &str| v.unwrap_or_else(|| fail(&format!("training.{what} is missing")));
    let mbs = need(t.int("micro_batch_size"), "micro_batch_size");
    let dp = need(t.int("data_parallel_size"), "data_parallel_size");
    let rank_width = need(t.int("rank_name_width"), "rank_name_width") as usize;
    let bytes = need(t.int("bytes_per_microbatch"), "bytes_per_microbatch") as usize;
    let files = t.get("microbatches").and_then(|m| m.int(split)).unwrap_or_else(|| fail("unknown split"));
    if files == 0 {
        println!("split {split}: no micro-batches");
        return;
    }
    let width = need(t.get("microbatch_name_width").and_then(|m| m.int(split)), "microbatch_name_width") as usize;
    let ranks_path = t.get("ranks_path").and_then(|m| m.string(split)).unwrap_or_else(|| fail("no ranks_path"));
    if rank < 0 || rank >= dp {
        fail("RANK is not below data_parallel_size");
    }
    if consumed < 0 || consumed % (mbs * dp) != 0 {
        fail("CONSUMED_SAMPLES is not a multiple of micro_batch_size x data_parallel_size");
    }
    let (size, signed) = match dtype {
        "uint8" => (1, false),
        "int8" => (1, true),
        "uint16" => (2, false),
        "int16" => (2, true),
        "uint32" => (4, false),
        "int32" => (4, true),
        "int64" => (8, true),
        "uint64" => (8, false),
        other => fail(&format!("unsupported dtype {other}")),
    };
    if bytes != (mbs * tokens) as usize * size {
        fail("bytes_per_microbatch does not match the dtype");
    }
    for j in consumed / (mbs * dp)..files {
        let path = format!("{mount}/{ranks_path}/{rank:0rank_width$}/{j:0width$}.bin");
        let data = fs::read(&path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        if data.len() != bytes {
            fail(&format!("{path}: {} bytes, expected {bytes}", data.len()));
        }
        let values = data.chunks_exact(size).map(|c| {
            let mut raw = [0u8; 8];
            raw[..size].copy_from_slice(c);
            let u = u64::from_le_bytes(raw);
            if signed && size < 8 && (u >> (size * 8 - 1)) & 1 == 1 {
                (u | !((1u64 << (size * 8)) - 1)) as i64
            } else {
                u as i64
            }
        });
        let (mut sum, mut first, mut last) = (0i64, None, 0i64);
        for v in values {
            sum += v;
            first.get_or_insert(v);
            last = v;
        }
        println!("{j} {sum} {} {last}", first.unwrap_or(0));
    }
}
