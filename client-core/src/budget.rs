//! Token budgets on the client side (the server's half: docs/budgets.md): the commands that
//! reserve a cost on several limits (`RL.BUDGET`, or the Functions library's `rl_budget`)
//! and settle it (`RL.SETTLE`, `rl_settle`), their replies, the reservation a caller holds
//! between the two, and the counters a budget keeps. No I/O: a shell sends the commands
//! built here and hands the replies back.

use crate::reply::{ProtocolError, Reply};

/// Which server-side implementation a command is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The module's commands (`RL.BUDGET`, `RL.SETTLE`).
    Module,
    /// The Functions library (`FCALL rl_budget`, `FCALL rl_settle`), keys first.
    Functions,
}

/// One limit of a budget: its key, its limit (tokens per second and burst) and what this
/// call reserves on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Part<'a> {
    pub key: &'a [u8],
    pub rate: f64,
    pub cap: f64,
    pub n: u64,
}

/// A number as the module reads it back exactly: the shortest digits that round-trip,
/// never an exponent (Rust's `Display` for `f64`).
fn number(x: f64) -> Vec<u8> {
    format!("{x}").into_bytes()
}

fn int(x: u64) -> Vec<u8> {
    x.to_string().into_bytes()
}

/// The arguments (command name first) that reserve `parts` for `ttl_ms`: all or nothing,
/// each key its own `n`. `version`: the limits' `VERSION`, one for every key.
pub fn budget_command(
    backend: Backend,
    ttl_ms: u64,
    parts: &[Part],
    version: Option<u64>,
) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(4 + 4 * parts.len());
    match backend {
        Backend::Module => {
            out.push(b"RL.BUDGET".to_vec());
            out.push(int(ttl_ms));
            for p in parts {
                out.extend([p.key.to_vec(), number(p.rate), number(p.cap), int(p.n)]);
            }
        }
        Backend::Functions => {
            out.extend([b"FCALL".to_vec(), b"rl_budget".to_vec()]);
            out.push(int(parts.len() as u64));
            out.extend(parts.iter().map(|p| p.key.to_vec()));
            out.push(int(ttl_ms));
            for p in parts {
                out.extend([number(p.rate), number(p.cap), int(p.n)]);
            }
        }
    }
    if let Some(v) = version {
        out.extend([b"VERSION".to_vec(), int(v)]);
    }
    out
}

/// The arguments that settle reservation `id` with what each key's call used.
pub fn settle_command(backend: Backend, id: u64, used: &[(&[u8], u64)]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(4 + 2 * used.len());
    match backend {
        Backend::Module => {
            out.push(b"RL.SETTLE".to_vec());
            out.push(int(id));
            for (k, a) in used {
                out.extend([k.to_vec(), int(*a)]);
            }
        }
        Backend::Functions => {
            out.extend([b"FCALL".to_vec(), b"rl_settle".to_vec()]);
            out.push(int(used.len() as u64));
            out.extend(used.iter().map(|(k, _)| k.to_vec()));
            out.push(int(id));
            out.extend(used.iter().map(|(_, a)| int(*a)));
        }
    }
    out
}

/// What `RL.BUDGET` answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Reserved {
    pub granted: bool,
    /// The reservation every key recorded (0: none: denied, every key exempt, or a shadow
    /// denial answered as a grant).
    pub id: u64,
    /// The key whose wait is longest, when denied.
    pub denied_by: Option<Vec<u8>>,
    pub retry_after_ms: u64,
    /// Each key's tokens after the call (`WITHSTATE`).
    pub remaining: Option<Vec<f64>>,
}

/// Reads `RL.BUDGET`'s reply for a call on `keys` keys.
pub fn parse_budget(reply: &Reply, keys: usize) -> Result<Reserved, ProtocolError> {
    let items = reply.items("RL.BUDGET")?;
    if items.len() != 4 && items.len() != 5 {
        return Err(ProtocolError(format!(
            "RL.BUDGET: 4 or 5 elements expected, got {}",
            items.len()
        )));
    }
    let granted = match items[0].int("RL.BUDGET granted")? {
        0 => false,
        1 => true,
        g => {
            return Err(ProtocolError(format!(
                "RL.BUDGET granted: {g} is not 0 or 1"
            )))
        }
    };
    let id = items[1].count("RL.BUDGET reservation_id")?;
    let denied_by = items[2]
        .bytes_or_nil("RL.BUDGET denied_by")?
        .map(<[u8]>::to_vec);
    if granted == denied_by.is_some() {
        return Err(ProtocolError(
            "RL.BUDGET: denied_by must name a key exactly when denied".into(),
        ));
    }
    if !granted && id != 0 {
        return Err(ProtocolError(
            "RL.BUDGET: a denial under a reservation id".into(),
        ));
    }
    let retry_after_ms = items[3].count("RL.BUDGET retry_after_ms")?;
    let remaining = match items.get(4) {
        None => None,
        Some(r) => {
            let list = r.items("RL.BUDGET remaining")?;
            if list.len() != keys {
                return Err(ProtocolError(format!(
                    "RL.BUDGET remaining: {keys} keys, {} values",
                    list.len()
                )));
            }
            Some(
                list.iter()
                    .map(|x| x.number("RL.BUDGET remaining"))
                    .collect::<Result<_, _>>()?,
            )
        }
    };
    Ok(Reserved {
        granted,
        id,
        denied_by,
        retry_after_ms,
        remaining,
    })
}

/// What `RL.SETTLE` did on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Tokens given back (reserved, not used; at most what the bucket lacked).
    Credited(u64),
    /// Tokens charged as debt (used beyond the reservation, down to `-cap`).
    Charged(u64),
    /// No live reservation there: expired, unknown or settled already. What was reserved
    /// stays charged.
    Unmatched,
}

impl Settled {
    /// As `RL.SETTLE` answers it: tokens back (positive), charged (negative), or `None`.
    pub fn signed(self) -> Option<i64> {
        match self {
            Settled::Credited(t) => Some(t.min(i64::MAX as u64) as i64),
            Settled::Charged(t) => Some(-(t.min(i64::MAX as u64) as i64)),
            Settled::Unmatched => None,
        }
    }
}

/// Reads `RL.SETTLE`'s reply for a call on `keys` keys.
pub fn parse_settle(reply: &Reply, keys: usize) -> Result<Vec<Settled>, ProtocolError> {
    let items = reply.items("RL.SETTLE")?;
    if items.len() != keys {
        return Err(ProtocolError(format!(
            "RL.SETTLE: {keys} keys, {} results",
            items.len()
        )));
    }
    items
        .iter()
        .map(|x| match x {
            Reply::Nil => Ok(Settled::Unmatched),
            Reply::Int(i) if *i >= 0 => Ok(Settled::Credited(*i as u64)),
            Reply::Int(i) => Ok(Settled::Charged(i.unsigned_abs())),
            other => Err(ProtocolError(format!(
                "RL.SETTLE: an integer or nil expected, got {other:?}"
            ))),
        })
        .collect()
}

/// A reservation a caller holds between `RL.BUDGET` and `RL.SETTLE`: which keys, what each
/// reserved, and whether it is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub id: u64,
    /// Each key and the tokens it reserved, in the call's order.
    pub parts: Vec<(Vec<u8>, u64)>,
    settled: bool,
}

impl Reservation {
    /// The reservation `reply` granted on `parts` (none: denied).
    pub fn granted(parts: &[Part], reply: &Reserved) -> Option<Reservation> {
        reply.granted.then(|| Reservation {
            id: reply.id,
            parts: parts.iter().map(|p| (p.key.to_vec(), p.n)).collect(),
            // Nothing recorded (exempt keys, a shadow denial): nothing to settle.
            settled: reply.id == 0,
        })
    }

    /// Whether a settle still has something to close.
    pub fn open(&self) -> bool {
        !self.settled
    }

    /// What a settle sends, each key's actual use: the one given for it, else its estimate
    /// (a caller that never learns the actual leaves the estimate charged, and the lease
    /// is closed rather than left to expire). `None` once settled: a second settle sends
    /// nothing (the server would change nothing either).
    pub fn settlement(&mut self, actual: &[Option<u64>]) -> Option<Vec<(Vec<u8>, u64)>> {
        if self.settled {
            return None;
        }
        self.settled = true;
        Some(
            self.parts
                .iter()
                .enumerate()
                // An actual above what the server reads (2^63 - 1) is charged as that much:
                // the debt is floored anyway, and the settle must not be refused.
                .map(|(i, (k, n))| {
                    let a = actual.get(i).copied().flatten().unwrap_or(*n);
                    (k.clone(), a.min(i64::MAX as u64))
                })
                .collect(),
        )
    }
}

/// What a budget counted: calls, tokens reserved, given back, charged, and settles that
/// found nothing (came after the reservation expired).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetCounters {
    pub granted: u64,
    pub denied: u64,
    pub reserved_tokens: u64,
    pub settled: u64,
    pub tokens_back: u64,
    pub tokens_overage: u64,
    pub unmatched: u64,
}

impl BudgetCounters {
    pub fn reserved(&mut self, parts: &[Part], reply: &Reserved) {
        if reply.granted {
            self.granted += 1;
            if reply.id != 0 {
                self.reserved_tokens = self
                    .reserved_tokens
                    .saturating_add(parts.iter().map(|p| p.n).fold(0u64, u64::saturating_add));
            }
        } else {
            self.denied += 1;
        }
    }

    pub fn settled(&mut self, results: &[Settled]) {
        for r in results {
            match *r {
                Settled::Credited(t) => {
                    self.settled += 1;
                    self.tokens_back = self.tokens_back.saturating_add(t);
                }
                Settled::Charged(t) => {
                    self.settled += 1;
                    self.tokens_overage = self.tokens_overage.saturating_add(t);
                }
                Settled::Unmatched => self.unmatched += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(args: &[Vec<u8>]) -> Vec<String> {
        args.iter()
            .map(|a| String::from_utf8(a.clone()).unwrap())
            .collect()
    }

    #[test]
    fn commands_for_both_backends() {
        let parts = [
            Part {
                key: b"{o}:rpm",
                rate: 8.5,
                cap: 500.0,
                n: 1,
            },
            Part {
                key: b"{o}:tpm",
                rate: 0.001,
                cap: 1e15,
                n: 4096,
            },
        ];
        assert_eq!(
            text(&budget_command(Backend::Module, 60000, &parts, Some(3))),
            [
                "RL.BUDGET",
                "60000",
                "{o}:rpm",
                "8.5",
                "500",
                "1",
                "{o}:tpm",
                "0.001",
                "1000000000000000",
                "4096",
                "VERSION",
                "3"
            ]
        );
        assert_eq!(
            text(&budget_command(Backend::Functions, 60000, &parts, None)),
            [
                "FCALL",
                "rl_budget",
                "2",
                "{o}:rpm",
                "{o}:tpm",
                "60000",
                "8.5",
                "500",
                "1",
                "0.001",
                "1000000000000000",
                "4096"
            ]
        );
        let used: [(&[u8], u64); 2] = [(b"{o}:rpm", 1), (b"{o}:tpm", 900)];
        assert_eq!(
            text(&settle_command(Backend::Module, 17, &used)),
            ["RL.SETTLE", "17", "{o}:rpm", "1", "{o}:tpm", "900"]
        );
        assert_eq!(
            text(&settle_command(Backend::Functions, 17, &used)),
            [
                "FCALL",
                "rl_settle",
                "2",
                "{o}:rpm",
                "{o}:tpm",
                "17",
                "1",
                "900"
            ]
        );
    }

    #[test]
    fn a_reservation_settles_once_with_the_estimate_where_no_actual_is_given() {
        let parts = [
            Part {
                key: b"a",
                rate: 1.0,
                cap: 10.0,
                n: 1,
            },
            Part {
                key: b"b",
                rate: 1.0,
                cap: 1000.0,
                n: 700,
            },
        ];
        let reply = Reserved {
            granted: true,
            id: 9,
            denied_by: None,
            retry_after_ms: 0,
            remaining: None,
        };
        let mut counters = BudgetCounters::default();
        counters.reserved(&parts, &reply);
        let mut r = Reservation::granted(&parts, &reply).unwrap();
        assert!(r.open());
        assert_eq!(
            r.settlement(&[None, Some(250)]),
            Some(vec![(b"a".to_vec(), 1), (b"b".to_vec(), 250)])
        );
        assert_eq!(r.settlement(&[]), None, "once");
        counters.settled(&[Settled::Credited(0), Settled::Credited(450)]);
        assert_eq!(counters.reserved_tokens, 701);
        assert_eq!((counters.settled, counters.tokens_back), (2, 450));
        // A grant that recorded nothing (every key exempt, a shadow denial): nothing to settle.
        let none = Reserved { id: 0, ..reply };
        assert!(!Reservation::granted(&parts, &none).unwrap().open());
        let denied = Reserved {
            granted: false,
            id: 0,
            denied_by: Some(b"b".to_vec()),
            retry_after_ms: 5,
            remaining: None,
        };
        assert_eq!(Reservation::granted(&parts, &denied), None);
    }

    fn any_reply() -> impl Strategy<Value = Reply> {
        let leaf = prop_oneof![
            Just(Reply::Nil),
            any::<i64>().prop_map(Reply::Int),
            any::<f64>().prop_map(Reply::Double),
            proptest::collection::vec(any::<u8>(), 0..6).prop_map(Reply::Bulk),
            "[a-z]{0,4}".prop_map(Reply::Simple),
            "[A-Z ]{0,6}".prop_map(Reply::Error),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Reply::Array),
                proptest::collection::vec((inner.clone(), inner), 0..3).prop_map(Reply::Map),
            ]
        })
    }

    proptest! {
        /// Any reply at all is read or refused with a ProtocolError: never a panic (the
        /// shells hand this whatever the wire carried).
        #[test]
        fn malformed_replies_are_errors(reply in any_reply(), keys in 0usize..4) {
            let _ = parse_budget(&reply, keys);
            let _ = parse_settle(&reply, keys);
        }

        /// A well-formed grant is read back as it was.
        #[test]
        fn well_formed_grants_read_back(id in 1u64..(i64::MAX as u64), rem in proptest::collection::vec(-1e15f64..1e15, 1..4)) {
            let reply = Reply::Array(vec![
                Reply::Int(1),
                Reply::Int(id as i64),
                Reply::Nil,
                Reply::Int(0),
                Reply::Array(rem.iter().map(|x| Reply::Bulk(format!("{x}").into_bytes())).collect()),
            ]);
            let r = parse_budget(&reply, rem.len()).unwrap();
            prop_assert!(r.granted);
            prop_assert_eq!(r.id, id);
            prop_assert_eq!(r.remaining.unwrap(), rem);
        }
    }
}
