//! The golden protocol cases (`protocol/cases/*.json`, format in its README) against the
//! module on a real server, in RESP2 and RESP3: each case's state is set with the internal
//! setters at a base instant read from the server's clock just before, then its arguments
//! run; the reply, the propagated effect (read back from the AOF, written before the reply
//! with `appendfsync always`) and the new state (`RL.PEEK`, or the key's digest when the
//! case leaves it unchanged) must be the case's. Numbers that move with time are compared
//! within the window between the base and a second reading after the call.

mod support;

use serde_json::Value as J;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use support::*;

/// A reply as the wire carries it (enough of RESP2 and RESP3 for these commands).
#[derive(Debug, Clone, PartialEq)]
enum V {
    Int(i64),
    Bulk(Vec<u8>),
    Simple(String),
    Double(f64),
    Nil,
    Array(Vec<V>),
    Map(Vec<(V, V)>),
    Err(String),
}

struct Raw {
    r: BufReader<TcpStream>,
}

impl Raw {
    fn open(port: u16, protocol: u8) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let mut raw = Raw {
            r: BufReader::new(s),
        };
        if protocol == 3 {
            let hello = raw.call(&["HELLO".into(), "3".into()]);
            assert!(matches!(hello, V::Map(_)), "{hello:?}");
        }
        raw
    }

    fn call(&mut self, args: &[String]) -> V {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.r.get_mut().write_all(&out).unwrap();
        self.read()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        l.trim_end_matches("\r\n").to_string()
    }

    fn read(&mut self) -> V {
        let l = self.line();
        let (t, rest) = l.split_at(1);
        match t {
            ":" => V::Int(rest.parse().unwrap()),
            "+" => V::Simple(rest.into()),
            "-" => V::Err(rest.into()),
            "," => V::Double(rest.parse().unwrap()),
            "_" => V::Nil,
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return V::Nil;
                }
                let mut buf = vec![0; n as usize + 2];
                std::io::Read::read_exact(&mut self.r, &mut buf).unwrap();
                buf.truncate(n as usize);
                V::Bulk(buf)
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return V::Nil;
                }
                V::Array((0..n).map(|_| self.read()).collect())
            }
            "%" => {
                let n: usize = rest.parse().unwrap();
                V::Map((0..n).map(|_| (self.read(), self.read())).collect())
            }
            _ => panic!("unexpected reply line {l:?}"),
        }
    }
}

/// The base instant and how long after it the call may have run.
#[derive(Clone, Copy)]
struct Window {
    base_us: i64,
    drift_us: i64,
    rate: f64,
}

impl Window {
    fn base_ns(&self) -> i64 {
        self.base_us * 1000
    }
    fn drift_ns(&self) -> i64 {
        self.drift_us * 1000
    }
    fn drift_ms(&self) -> i64 {
        (self.drift_us + 999) / 1000
    }
    fn tokens_close(&self, want: f64, got: f64) -> bool {
        let slack = 1e-9 * want.abs().max(1.0);
        (got - want).abs() <= self.rate * self.drift_ns() as f64 / 1e9 + slack
    }
    fn at_close(&self, want: i64, got: i64) -> bool {
        want - 1000 <= got && got <= want + self.drift_ns() + 1000
    }
    fn id_close(&self, want: i64, got: i64) -> bool {
        want <= got && got <= want + self.drift_us
    }
}

/// A one-field object's tag and value (`{"ms": 1500}`).
fn tagged(j: &J) -> Option<(&str, &J)> {
    let o = j.as_object().filter(|o| o.len() == 1)?;
    o.iter().next().map(|(k, v)| (k.as_str(), v))
}

fn num(j: &J) -> f64 {
    j.as_f64().unwrap()
}

fn int(j: &J) -> i64 {
    j.as_i64().unwrap_or_else(|| j.as_f64().unwrap() as i64)
}

fn text(v: &V) -> Option<String> {
    match v {
        V::Bulk(b) => String::from_utf8(b.clone()).ok(),
        V::Simple(s) => Some(s.clone()),
        _ => None,
    }
}

/// Whether a reply matches a case's typed expectation (README: "Replies").
fn matches(want: &J, got: &V, w: &Window) -> bool {
    match want {
        J::Null => *got == V::Nil,
        J::Number(n) => matches!(got, V::Int(i) if Some(*i) == n.as_i64()),
        J::String(s) => matches!(got, V::Bulk(b) if b == s.as_bytes()),
        J::Array(items) => match got {
            V::Array(g) => {
                g.len() == items.len() && items.iter().zip(g).all(|(a, b)| matches(a, b, w))
            }
            _ => false,
        },
        J::Bool(_) => false,
        J::Object(_) => {
            let (tag, x) = tagged(want).expect("a tagged value");
            let as_f64 = |v: &V| text(v).and_then(|t| t.parse::<f64>().ok());
            match (tag, got) {
                ("error", V::Err(e)) => x.as_str() == Some(e.as_str()),
                ("simple", V::Simple(t)) => x.as_str() == Some(t.as_str()),
                ("double", V::Double(d)) => *d == num(x),
                ("tokens", V::Double(d)) => w.tokens_close(num(x), *d),
                ("double_text", V::Bulk(_)) => as_f64(got) == Some(num(x)),
                ("tokens_text", V::Bulk(_)) => {
                    as_f64(got).is_some_and(|g| w.tokens_close(num(x), g))
                }
                ("ms", V::Int(g)) => (int(x) - w.drift_ms() - 1..=int(x) + 1).contains(g),
                ("id", V::Int(g)) => w.id_close(int(x), g - w.base_us),
                ("map", V::Map(pairs)) => same_pairs(x, pairs.clone(), w),
                ("pairs", V::Array(flat)) if flat.len() % 2 == 0 => {
                    let pairs = flat
                        .chunks(2)
                        .map(|p| (p[0].clone(), p[1].clone()))
                        .collect();
                    same_pairs(x, pairs, w)
                }
                _ => false,
            }
        }
    }
}

/// A map's pairs, in any order.
fn same_pairs(want: &J, got: Vec<(V, V)>, w: &Window) -> bool {
    let want = want.as_array().unwrap();
    want.len() == got.len()
        && want.iter().all(|p| {
            let k = p[0].as_str().unwrap();
            got.iter()
                .any(|(gk, gv)| text(gk).as_deref() == Some(k) && matches(&p[1], gv, w))
        })
}

/// One argument of a case's command or effect, on this run's clock.
fn arg(j: &J, w: &Window) -> String {
    match j {
        J::String(s) => s.clone(),
        _ => match tagged(j) {
            Some(("id", x)) => (w.base_us + int(x)).to_string(),
            Some(("at", x)) => (w.base_ns() + int(x)).to_string(),
            _ => panic!("argument {j}"),
        },
    }
}

/// Whether one effect argument from the AOF is the case's.
fn effect_arg(want: &J, got: &str, w: &Window) -> bool {
    let n = || got.parse::<i64>().ok();
    match tagged(want) {
        Some(("at", x)) => n().is_some_and(|g| w.at_close(int(x), g - w.base_ns())),
        Some(("id", x)) => n().is_some_and(|g| w.id_close(int(x), g - w.base_us)),
        Some(("fields", x)) => {
            let parts: Vec<&str> = got.split(',').collect();
            let x = x.as_array().unwrap();
            parts.len() == x.len() && x.iter().zip(parts).all(|(a, b)| effect_arg(a, b, w))
        }
        _ => want.as_str() == Some(got),
    }
}

/// The commands appended to the AOF after `mark` bytes (SELECT, MULTI and EXEC left out).
fn aof_since(s: &Server, mark: usize) -> Vec<Vec<String>> {
    let text = aof(s);
    let mut out = Vec::new();
    let mut lines = text[mark..].split("\r\n");
    while let Some(l) = lines.next() {
        let Some(n) = l.strip_prefix('*') else {
            continue;
        };
        let cmd: Vec<String> = (0..n.parse::<usize>().unwrap())
            .map(|_| {
                lines.next();
                lines.next().unwrap().to_string()
            })
            .collect();
        if !["SELECT", "MULTI", "EXEC"].contains(&cmd[0].to_ascii_uppercase().as_str()) {
            out.push(cmd);
        }
    }
    out
}

fn aof(s: &Server) -> String {
    let dir = s.dir.path().join("appendonlydir");
    let mut text = String::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().ends_with(".incr.aof") {
            text += &String::from_utf8_lossy(&std::fs::read(p).unwrap());
        }
    }
    text
}

fn server_us(c: &mut Connection) -> i64 {
    let (s, us): (String, String) = redis::cmd("TIME").query(c).unwrap();
    s.parse::<i64>().unwrap() * 1_000_000 + us.parse::<i64>().unwrap()
}

/// Sets `key` to a case's state with the internal setters (one call per lease or permit).
fn set_state(c: &mut Connection, key: &str, s: &J, base_us: i64) {
    let base_ns = base_us * 1000;
    let field = |f: &str| s.get(f);
    if field("type").and_then(J::as_str) == Some("permits") {
        let mut calls = vec![vec![
            "RL.SETPERMITS".to_string(),
            key.into(),
            "LASTID".into(),
            (base_us + int(&s["last_id"])).to_string(),
        ]];
        for p in s["permits"].as_array().unwrap() {
            calls.push(vec![
                "RL.SETPERMITS".into(),
                key.into(),
                "LASTID".into(),
                (base_us + int(&s["last_id"])).to_string(),
                "ADD".into(),
                (base_us + int(&p[0])).to_string(),
                (base_ns + int(&p[1])).to_string(),
            ]);
        }
        for call in calls {
            let _: () = redis::cmd(&call[0]).arg(&call[1..]).query(c).unwrap();
        }
        return;
    }
    if field("type").and_then(J::as_str) == Some("share") {
        // One RL.SETSHARES per holder (what the AOF holds for a share key), the longest
        // lasting first: each call sets the key's expiry to its table's last end, so no
        // call expires the key before the rest are in (a case may hold ended entries).
        let mut holders = s["holders"].as_array().unwrap().clone();
        holders.sort_by_key(|h| std::cmp::Reverse(int(&h[4]).max(int(&h[7]))));
        let head = [
            "RL.SETSHARES".to_string(),
            key.into(),
            s["rate"].as_str().unwrap().into(),
            s["cap"].as_str().unwrap().into(),
            field("version").map_or(0, int).to_string(),
            "0".into(),
        ];
        // The key's pin, in every call (a call without it leaves none), or alone.
        let pin = field("pin").map(|p| share_pin_text(p, base_ns));
        if holders.is_empty() {
            let mut call = head.to_vec();
            call.push(
                pin.clone()
                    .expect("a share state without holders has a pin"),
            );
            let _: () = redis::cmd(&call[0])
                .arg(&call[1..])
                .query(c)
                .unwrap_or_else(|e| panic!("{call:?}: {e}"));
        }
        for h in holders {
            let fields = [
                share_number(&h[1]),
                share_number(&h[2]),
                share_number(&h[3]),
                (base_ns + int(&h[4])).to_string(),
                share_number(&h[5]),
                share_number(&h[6]),
                (base_ns + int(&h[7])).to_string(),
            ];
            let mut call = head.to_vec();
            call.extend([h[0].as_str().unwrap().to_string(), fields.join(",")]);
            call.extend(pin.clone());
            let _: () = redis::cmd(&call[0])
                .arg(&call[1..])
                .query(c)
                .unwrap_or_else(|e| panic!("{call:?}: {e}"));
        }
        return;
    }
    let pin = field("pin");
    // A key that holds only a pin stores an empty bucket: full_at 0 (absolute), limit 1 1
    // (BLOCK, EXEMPT) or the rate pin's own limit.
    let absent = pin.is_some_and(|p| p["absent"] == J::Bool(true));
    let (full_at, rate, cap) = if absent {
        let p = pin.unwrap();
        let own = |f: &str| p.get(f).and_then(J::as_str).unwrap_or("1").to_string();
        ("0".to_string(), own("base_rate"), own("base_cap"))
    } else {
        (
            (base_ns + int(&s["full_at"])).to_string(),
            s["rate"].as_str().unwrap().to_string(),
            s["cap"].as_str().unwrap().to_string(),
        )
    };
    let mut head = vec![
        "RL.SETSTATE".to_string(),
        key.into(),
        full_at,
        rate.clone(),
        cap.clone(),
    ];
    if let Some(span) = field("span") {
        head.extend([
            "HOLD".into(),
            (base_ns + int(&s["hold"])).to_string(),
            "SPAN".into(),
            int(span).to_string(),
        ]);
    }
    if let Some(v) = field("version") {
        head.extend(["VERSION".into(), int(v).to_string()]);
    }
    if let Some(p) = pin {
        let until = int(&p["until"]);
        let text = |f: &str, or: &str| p.get(f).and_then(J::as_str).unwrap_or(or).to_string();
        head.extend([
            "PIN".into(),
            pin_code(p).to_string(),
            if until == 0 { 0 } else { base_ns + until }.to_string(),
            text("base_rate", &rate),
            text("base_cap", &cap),
            u8::from(absent).to_string(),
        ]);
    }
    let mut first = head.clone();
    if let Some(id) = field("last_id") {
        first.extend(["LASTID".into(), (base_us + int(id)).to_string()]);
    }
    let mut calls = vec![first];
    for l in field("leases").and_then(J::as_array).into_iter().flatten() {
        let mut call = head.clone();
        call.extend([
            "ADD".into(),
            (base_us + int(&l[0])).to_string(),
            int(&l[1]).to_string(),
            (base_ns + int(&l[2])).to_string(),
        ]);
        calls.push(call);
    }
    for call in calls {
        let _: () = redis::cmd(&call[0])
            .arg(&call[1..])
            .query(c)
            .unwrap_or_else(|e| panic!("{call:?}: {e}"));
    }
}

/// A case's pin kind as its code (effects, RL.SETSTATE).
fn pin_code(p: &J) -> u8 {
    match p["kind"].as_str().unwrap() {
        "rate" => 1,
        "block" => 2,
        "exempt" => 3,
        k => panic!("pin kind {k}"),
    }
}

/// A share state's pin as `RL.SETSHARES` takes it: `kind,until` or `1,until,rate,cap`
/// (until absolute, 0: no end).
fn share_pin_text(p: &J, base_ns: i64) -> String {
    let until = int(&p["until"]);
    let mut t = format!(
        "{},{}",
        pin_code(p),
        if until == 0 { 0 } else { base_ns + until }
    );
    if pin_code(p) == 1 {
        t += &format!(
            ",{},{}",
            p["rate"].as_str().unwrap(),
            p["cap"].as_str().unwrap()
        );
    }
    t
}

/// A case's pin if it lives at the call (`until` 0: no end; negative: it ended before).
fn live_pin(s: &J) -> Option<&J> {
    s.get("pin").filter(|p| int(&p["until"]) >= 0)
}

/// A share entry's number as text (JSON writes whole numbers without a point).
fn share_number(j: &J) -> String {
    j.to_string()
}

/// One holder as a share state lists it: `[id, want, rate, burst, lease_end, held_rate,
/// held_burst, held_until]`, instants absolute (ns).
#[derive(Debug, PartialEq)]
struct Entry {
    id: Vec<u8>,
    numbers: [f64; 5],
    times: [i64; 2],
}

/// A share key's stored table read from its DUMP payload (the module's RDB encoding 2,
/// src/share/mod.rs): (rate, cap, version, entries).
fn dumped_share(c: &mut Connection, key: &str) -> Option<(f64, f64, u64, Vec<Entry>, DumpedPin)> {
    let payload: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(c).unwrap();
    let payload = payload?;
    let b = &payload[..payload.len() - 10];
    if b[0] != 7 {
        return None; // RDB_TYPE_MODULE_2: not a module value
    }
    let mut at = 1;
    let len = |at: &mut usize| -> u64 {
        let first = b[*at];
        *at += 1;
        match first >> 6 {
            0 => u64::from(first & 0x3f),
            1 => {
                *at += 1;
                (u64::from(first & 0x3f) << 8) | u64::from(b[*at - 1])
            }
            _ if first == 0x80 => {
                *at += 4;
                u64::from(u32::from_be_bytes(b[*at - 4..*at].try_into().unwrap()))
            }
            _ if first == 0x81 => {
                *at += 8;
                u64::from_be_bytes(b[*at - 8..*at].try_into().unwrap())
            }
            _ => panic!("{key}: DUMP: not a length at {}: {first:#x}", *at - 1),
        }
    };
    let _module_id = len(&mut at);
    let item = |op: u64, at: &mut usize| -> Vec<u8> {
        assert_eq!(len(at), op, "{key}: DUMP: opcode at {}", *at - 1);
        match op {
            2 => len(at).to_le_bytes().to_vec(),
            4 => {
                *at += 8;
                b[*at - 8..*at].to_vec()
            }
            _ => {
                // An RDB string: ids here are short and not integers, so stored plain.
                let n = len(at) as usize;
                *at += n;
                b[*at - n..*at].to_vec()
            }
        }
    };
    let double = |v: Vec<u8>| f64::from_le_bytes(v.try_into().unwrap());
    let uint = |v: Vec<u8>| u64::from_le_bytes(v.try_into().unwrap());
    let (rate, cap) = (double(item(4, &mut at)), double(item(4, &mut at)));
    let version = uint(item(2, &mut at));
    let count = uint(item(2, &mut at));
    let mut entries = Vec::new();
    for _ in 0..count {
        let id = item(5, &mut at);
        let (want, r, burst) = (
            double(item(4, &mut at)),
            double(item(4, &mut at)),
            double(item(4, &mut at)),
        );
        let lease_end = uint(item(2, &mut at)) as i64;
        let (hr, hb) = (double(item(4, &mut at)), double(item(4, &mut at)));
        let held_until = uint(item(2, &mut at)) as i64;
        entries.push(Entry {
            id,
            numbers: [want, r, burst, hr, hb],
            times: [lease_end, held_until],
        });
    }
    // Encoding 2: the pin: its kind (0: none), end, and a rate pin's limit.
    let code = uint(item(2, &mut at));
    let pin = (code != 0).then(|| {
        let until = uint(item(2, &mut at)) as i64;
        let limit = (code == 1).then(|| (double(item(4, &mut at)), double(item(4, &mut at))));
        (code, until, limit)
    });
    assert_eq!(len(&mut at), 0, "{key}: DUMP: no EOF opcode");
    Some((rate, cap, version, entries, pin))
}

/// A share key's stored pin: kind code, end (absolute ns, 0: none), a rate pin's limit.
type DumpedPin = Option<(u64, i64, Option<(f64, f64)>)>;

/// What a share key must hold for a share state at the call's time: its limit, version
/// and entries exact (instants within the window), and its expiry at its last entry's end.
fn share_problems(c: &mut Connection, key: &str, s: &J, w: &Window) -> Option<String> {
    let Some((rate, cap, version, got, pin)) = dumped_share(c, key) else {
        return Some(format!("{key}: not a share key, want the state {s}"));
    };
    let want: Vec<&J> = s["holders"].as_array().unwrap().iter().collect();
    let entry_ok = |h: &J, e: &Entry| {
        h[0].as_str().unwrap().as_bytes() == e.id.as_slice()
            && [1, 2, 3, 5, 6]
                .iter()
                .zip(e.numbers)
                .all(|(&i, x)| num(&h[i]) == x && !x.is_sign_negative())
            && w.at_close(int(&h[4]), e.times[0] - w.base_ns())
            && w.at_close(int(&h[7]), e.times[1] - w.base_ns())
    };
    let ok = rate == s["rate"].as_str().unwrap().parse::<f64>().unwrap()
        && cap == s["cap"].as_str().unwrap().parse::<f64>().unwrap()
        && version == s.get("version").map_or(0, |v| int(v) as u64)
        && want.len() == got.len()
        && want.iter().zip(&got).all(|(h, e)| entry_ok(h, e));
    let want_pin = s.get("pin");
    let pin_ok = match (want_pin, pin) {
        (None, None) => true,
        (Some(p), Some((code, until, limit))) => {
            let want_until = int(&p["until"]);
            let limit_want = (pin_code(p) == 1).then(|| {
                let f = |n: &str| p[n].as_str().unwrap().parse::<f64>().unwrap();
                (f("rate"), f("cap"))
            });
            code == u64::from(pin_code(p))
                && limit == limit_want
                && if want_until == 0 {
                    until == 0
                } else {
                    w.at_close(want_until, until - w.base_ns())
                }
        }
        _ => false,
    };
    if !pin_ok {
        return Some(format!(
            "{key}: stored pin {pin:?} (until: base + {} ns), want {want_pin:?}",
            pin.map_or(0, |p| p.1 - w.base_ns())
        ));
    }
    if !ok {
        let got: Vec<String> = got
            .iter()
            .map(|e| {
                format!(
                    "{} {:?} lease_end {} held_until {} (base + ns)",
                    String::from_utf8_lossy(&e.id),
                    e.numbers,
                    e.times[0] - w.base_ns(),
                    e.times[1] - w.base_ns()
                )
            })
            .collect();
        return Some(format!(
            "{key}: stored limit {rate} {cap} version {version} entries {got:?}, want the state {s}"
        ));
    }
    // The key expires when its last entry ends (rounded up to a millisecond); pinned, never
    // while the pin has no end, else not before the pin's end.
    let expiry: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    if want_pin.is_some_and(|p| int(&p["until"]) == 0) {
        return (expiry != -1).then(|| {
            format!("{key}: expires at {expiry} ms, want no expiry while pinned without an end")
        });
    }
    let last = want
        .iter()
        .map(|h| int(&h[4]).max(int(&h[7])))
        .chain(want_pin.map(|p| int(&p["until"])))
        .max()
        .unwrap();
    let (lo, hi) = (
        (w.base_ns() + last - 1000 + 999_999) / 1_000_000,
        (w.base_ns() + last + w.drift_ns() + 1000 + 999_999) / 1_000_000,
    );
    (!(lo..=hi).contains(&expiry)).then(|| {
        format!(
            "{key}: expires at {} ms after the base, want its last end {last} ns",
            expiry - w.base_us / 1000
        )
    })
}

/// What `RL.PEEK` must show for a bucket state at the call's time.
fn peek_problems(key: &str, v: redis::Value, s: &J, w: &Window) -> Option<String> {
    let redis::Value::Array(items) = v else {
        return Some(format!("{key}: RL.PEEK {v:?}, want a bucket"));
    };
    let at_of = |name: &str| {
        items
            .iter()
            .step_by(2)
            .position(|x| redis::from_redis_value::<String>(x).is_ok_and(|t| t == name))
            .map(|i| 2 * i)
    };
    // RL.PEEK names the pin that decides, and only then.
    let pinned = at_of("pinned").map(|at| redis::from_redis_value::<String>(&items[at + 1]).ok());
    let want_pinned = live_pin(s).map(|p| p["kind"].as_str().unwrap().to_string());
    if pinned != want_pinned.clone().map(Some) {
        return Some(format!(
            "{key}: RL.PEEK {items:?}, want pinned {want_pinned:?}"
        ));
    }
    let field = |name: &str| -> f64 {
        let at = at_of(name).unwrap();
        redis::from_redis_value::<String>(&items[at + 1])
            .unwrap()
            .parse()
            .unwrap()
    };
    let (rate, cap) = (
        s["rate"].as_str().unwrap().parse::<f64>().unwrap(),
        s["cap"].as_str().unwrap().parse::<f64>().unwrap(),
    );
    let full_at = int(&s["full_at"]);
    let tokens = if full_at > 0 {
        cap - full_at as f64 * rate / 1e9
    } else {
        cap
    };
    let leases = s
        .get("leases")
        .and_then(J::as_array)
        .cloned()
        .unwrap_or_default();
    let held: i64 = leases.iter().map(|l| int(&l[1])).sum();
    let reset = (full_at.max(0) + 999_999) / 1_000_000;
    let ok = field("rate") == rate
        && field("cap") == cap
        && field("version") == s.get("version").map_or(0.0, num)
        && field("leases") == leases.len() as f64
        && field("leased_tokens") == held as f64
        && w.tokens_close(tokens, field("tokens"))
        && (reset - w.drift_ms() - 1..=reset + 1).contains(&(field("reset_after_ms") as i64));
    (!ok).then(|| format!("{key}: RL.PEEK {items:?}, want the state {s}"))
}

/// What `RL.PINNED` must answer for a bucket state: nil without a live pin, else its kind,
/// a rate pin's limit (the bucket's), and the time left (-1: no end).
fn pinned_problems(key: &str, v: redis::Value, s: &J, w: &Window) -> Option<String> {
    let Some(p) = live_pin(s) else {
        return (v != redis::Value::Nil).then(|| format!("{key}: RL.PINNED {v:?}, want nil"));
    };
    let pairs: Vec<(String, redis::Value)> = match &v {
        redis::Value::Map(m) => m.clone(),
        redis::Value::Array(a) => a.chunks(2).map(|x| (x[0].clone(), x[1].clone())).collect(),
        _ => return Some(format!("{key}: RL.PINNED {v:?}, want the pin {p}")),
    }
    .into_iter()
    .map(|(k, v)| (redis::from_redis_value::<String>(&k).unwrap(), v))
    .collect();
    let get = |f: &str| pairs.iter().find(|(k, _)| k == f).map(|(_, v)| v.clone());
    let number = |f: &str| {
        get(f).and_then(|x| match x {
            redis::Value::Double(d) => Some(d),
            x => redis::from_redis_value::<String>(&x).ok()?.parse().ok(),
        })
    };
    let kind = p["kind"].as_str().unwrap();
    // A share key's rate pin has its own limit; a bucket's is the bucket's.
    // A rate pin on a key that held nothing: the key's limit is the pin's (its base).
    let absent = p["absent"] == J::Bool(true);
    let limit = |f: &str| {
        let own = if absent {
            p.get(format!("base_{f}").as_str())
        } else {
            p.get(f)
        };
        own.unwrap_or(&s[f]).as_str().unwrap().parse().ok()
    };
    let limit_ok = if kind == "rate" {
        number("rate") == limit("rate") && number("cap") == limit("cap")
    } else {
        get("rate") == Some(redis::Value::Nil) && get("cap") == Some(redis::Value::Nil)
    };
    let until = int(&p["until"]);
    let left = match get("ms_left") {
        Some(redis::Value::Int(ms)) => ms,
        _ => i64::MIN,
    };
    let left_ok = if until == 0 {
        left == -1
    } else {
        let ms = (until + 999_999) / 1_000_000;
        (ms - w.drift_ms() - 1..=ms + 1).contains(&left)
    };
    let ok = pairs.len() == 4
        && get("kind")
            .and_then(|k| redis::from_redis_value::<String>(&k).ok())
            .as_deref()
            == Some(kind)
        && limit_ok
        && left_ok;
    (!ok).then(|| format!("{key}: RL.PINNED {v:?}, want the pin {p}"))
}

fn digest_or_none(c: &mut Connection, key: &str) -> Option<String> {
    let v: Vec<Option<String>> = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(c)
        .unwrap();
    v.into_iter().next().flatten()
}

fn case_rate(case: &J) -> f64 {
    let mut rate: f64 = 0.0;
    for part in ["state", "after"] {
        for s in case[part].as_object().into_iter().flat_map(|o| o.values()) {
            if let Some(r) = s.get("rate").and_then(J::as_str) {
                rate = rate.max(r.parse().unwrap());
            }
        }
    }
    rate
}

/// The earliest instant after the call in the case's states (µs): a run whose window
/// reaches it saw a key expire or a lease end that the case has live, and says nothing.
fn earliest_us(case: &J) -> i64 {
    let mut at = Vec::new();
    for part in ["state", "after"] {
        for s in case[part].as_object().into_iter().flat_map(|o| o.values()) {
            at.extend(
                ["full_at", "hold"]
                    .iter()
                    .filter_map(|f| s.get(*f))
                    .map(int),
            );
            // A pin's end.
            at.extend(s.get("pin").map(|p| int(&p["until"])));
            // A share entry's lease end and hold end.
            for h in s.get("holders").and_then(J::as_array).into_iter().flatten() {
                at.extend([int(&h[4]), int(&h[7])]);
            }
            for list in ["leases", "permits"] {
                for item in s.get(list).and_then(J::as_array).into_iter().flatten() {
                    at.push(int(item.as_array().unwrap().last().unwrap()));
                }
            }
        }
    }
    at.into_iter()
        .filter(|&t| t > 0)
        .min()
        .map_or(i64::MAX, |ns| ns / 1000)
}

/// Runs one case at `protocol`: the problems found (none: the module is the case), or
/// `None` if the run took so long that a state the case has live ran out meanwhile.
fn run(
    s: &Server,
    c: &mut Connection,
    raw: &mut Raw,
    case: &J,
    protocol: u8,
) -> Option<Vec<String>> {
    let _: () = redis::cmd("FLUSHALL").query(c).unwrap();
    let base_us = server_us(c);
    let empty = serde_json::Map::new();
    let state = case["state"].as_object().unwrap_or(&empty);
    for (key, st) in state {
        if !st.is_null() {
            set_state(c, key, st, base_us);
        }
    }
    let after = case["after"].as_object().unwrap_or(&empty);
    let digests: Vec<Option<String>> = after.keys().map(|k| digest_or_none(c, k)).collect();
    let mark = aof(s).len();
    let mut w = Window {
        base_us,
        drift_us: 0,
        rate: case_rate(case),
    };
    let args: Vec<String> = case["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| arg(a, &w))
        .collect();
    let got = raw.call(&args);
    w.drift_us = server_us(c) - base_us + 1;

    let mut problems = Vec::new();
    let want = &case[format!("resp{protocol}")];
    if !matches(want, &got, &w) {
        problems.push(format!("reply: want {want}, got {got:?}"));
    }
    let effects = aof_since(s, mark);
    let want_effects = case["effect"].as_array().unwrap();
    let same = effects.len() == want_effects.len()
        && want_effects.iter().zip(&effects).all(|(we, ge)| {
            let we = we.as_array().unwrap();
            we.len() == ge.len() && we.iter().zip(ge).all(|(a, b)| effect_arg(a, b, &w))
        });
    if !same {
        problems.push(format!("effect: want {want_effects:?}, got {effects:?}"));
    }
    for ((key, st), before) in after.iter().zip(digests) {
        if state.get(key) == Some(st) {
            if digest_or_none(c, key) != before {
                problems.push(format!("{key}: changed, the case leaves it as it was"));
            }
        } else if st.is_null() {
            let exists: bool = redis::cmd("EXISTS").arg(key).query(c).unwrap();
            if exists {
                problems.push(format!("{key}: exists, the case deletes it"));
            }
        } else {
            match st.get("type").and_then(J::as_str).unwrap_or("bucket") {
                "bucket" => {
                    // RL.PEEK reads the clock later still: widen the window to then.
                    let v: redis::Value = redis::cmd("RL.PEEK").arg(key).query(c).unwrap();
                    let pinned: redis::Value = redis::cmd("RL.PINNED").arg(key).query(c).unwrap();
                    let peeked = Window {
                        drift_us: server_us(c) - base_us + 1,
                        ..w
                    };
                    let bare = st.get("pin").is_some_and(|p| p["absent"] == J::Bool(true));
                    if bare {
                        // The key holds only its pin: RL.PEEK shows a full bucket (nil).
                        let exists: bool = redis::cmd("EXISTS").arg(key).query(c).unwrap();
                        if v != redis::Value::Nil || !exists {
                            problems.push(format!(
                                "{key}: RL.PEEK {v:?} (exists: {exists}), \
                                 want a key that holds only its pin"
                            ));
                        }
                    } else {
                        problems.extend(peek_problems(key, v, st, &peeked));
                    }
                    problems.extend(pinned_problems(key, pinned, st, &peeked));
                }
                "share" => {
                    let pinned: redis::Value = redis::cmd("RL.PINNED").arg(key).query(c).unwrap();
                    let read = Window {
                        drift_us: server_us(c) - base_us + 1,
                        ..w
                    };
                    problems.extend(share_problems(c, key, st, &w));
                    problems.extend(pinned_problems(key, pinned, st, &read));
                }
                _ => {
                    let exists: bool = redis::cmd("EXISTS").arg(key).query(c).unwrap();
                    if !exists {
                        problems.push(format!("{key}: absent, the case stores it"));
                    }
                }
            }
        }
    }
    (server_us(c) - base_us < earliest_us(case)).then_some(problems)
}

fn cases() -> Vec<(String, J)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol/cases");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let doc: J = serde_json::from_str(&std::fs::read_to_string(&f).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let family = f.file_stem().unwrap().to_string_lossy().to_string();
        for case in doc["cases"].as_array().unwrap() {
            out.push((family.clone(), case.clone()));
        }
    }
    out
}

#[test]
fn every_golden_case_holds_on_the_module() {
    let s = Server::start(&[
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        "no",
        "--appendfsync",
        "always",
    ]);
    let mut c = s.internal_conn();
    let mut failures = Vec::new();
    let all = cases();
    assert!(all.len() >= 50, "{} cases", all.len());
    for protocol in [2, 3] {
        let mut raw = Raw::open(s.port, protocol);
        for (family, case) in &all {
            // A run slower than the case's shortest state (half a second) cannot observe it:
            // run it again rather than compare (the outcome never depends on the speed).
            let problems = (0..10)
                .find_map(|_| run(&s, &mut c, &mut raw, case, protocol))
                .unwrap_or_else(|| {
                    vec!["ten runs each slower than the case's shortest state".into()]
                });
            if !problems.is_empty() {
                failures.push(format!(
                    "{family}: {} (RESP{protocol}): {problems:#?}",
                    case["name"]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
