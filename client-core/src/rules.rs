//! One check of a rules document, as a state machine with no I/O: the plan of a request
//! ([`crate::rules_doc`]) in, the `RL.MTAKE` calls to send out one at a time, the replies
//! (or failures) back in, then the decision and the tokens to give back. Both clients'
//! `Rules::check` drive it; what a request gets is decided here once.
//!
//! - The buckets of every enforced layer that applies are taken with one `RL.MTAKE` (all or
//!   nothing). In a cluster, one per hash slot in document order; a later slot's refusal
//!   gives back (`RL.REFUND`) what earlier slots granted.
//! - Shadow layers are taken after a grant, each on its own; a shadow refusal is reported,
//!   never enforced, and a shadow call that fails changes nothing.
//! - `cost` tokens from every bucket (1 by default); a cost no bucket could ever grant is
//!   the caller's error, found before any call.
//! - Redis failing (no reply, an error reply) is decided by the failure policy:
//!   `fail_open` grants (a fallback decision), otherwise a fallback denial by the first
//!   enforced layer, retry after 1 s. Either way a decision, never an error: a caller
//!   answers a request the same way whatever happened to Redis. When no enforced layer
//!   applies there is nothing to refuse: granted.
//! - A malformed reply is a [`ProtocolError`] (as everywhere in the client core: a server
//!   of another version is a bug to see, not an outage to ride out). To an enforced call it
//!   ends the check with no decision (the shell gives back [`Check::refunds`], then raises
//!   it); to a shadow call it skips that layer (the shell reports it, the grant stands).

use crate::budget::Backend;
use crate::reply::{ProtocolError, Reply};
use crate::rules_doc::Applied;

/// The wait a fail-closed denial asks for.
pub const FAIL_CLOSED_RETRY_MS: u64 = 1000;

/// A number as the module reads it back exactly (Rust's shortest round-trip digits).
pub(crate) fn number(x: f64) -> Vec<u8> {
    format!("{x}").into_bytes()
}

fn int(x: u64) -> Vec<u8> {
    x.to_string().into_bytes()
}

/// The arguments (command name first) of `RL.MTAKE n key rate cap ... [WITHSTATE]`, or the
/// Functions library's `FCALL rl_mtake N key.. n rate cap ..`: `n` tokens from every
/// `(key, rate, cap)` bucket, or from none.
pub fn mtake_command(
    backend: Backend,
    buckets: &[(&[u8], f64, f64)],
    n: u64,
    withstate: bool,
) -> Vec<Vec<u8>> {
    let texts: Vec<(&[u8], Vec<u8>, Vec<u8>)> = buckets
        .iter()
        .map(|(k, rate, cap)| (*k, number(*rate), number(*cap)))
        .collect();
    let refs: Vec<(&[u8], &[u8], &[u8])> = texts
        .iter()
        .map(|(k, r, c)| (*k, r.as_slice(), c.as_slice()))
        .collect();
    mtake_texts(backend, &refs, n, withstate)
}

/// As [`mtake_command`], rates and caps already formatted.
fn mtake_texts(
    backend: Backend,
    buckets: &[(&[u8], &[u8], &[u8])],
    n: u64,
    withstate: bool,
) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(4 + 3 * buckets.len());
    match backend {
        Backend::Module => {
            out.push(b"RL.MTAKE".to_vec());
            out.push(int(n));
            for (key, rate, cap) in buckets {
                out.extend([key.to_vec(), rate.to_vec(), cap.to_vec()]);
            }
        }
        Backend::Functions => {
            out.extend([b"FCALL".to_vec(), b"rl_mtake".to_vec()]);
            out.push(int(buckets.len() as u64));
            out.extend(buckets.iter().map(|b| b.0.to_vec()));
            out.push(int(n));
            for (_, rate, cap) in buckets {
                out.extend([rate.to_vec(), cap.to_vec()]);
            }
        }
    }
    if withstate {
        out.push(b"WITHSTATE".to_vec());
    }
    out
}

/// `RL.REFUND key n` (or `FCALL rl_refund 1 key n`).
pub fn refund_command(backend: Backend, key: &[u8], n: u64) -> Vec<Vec<u8>> {
    match backend {
        Backend::Module => vec![b"RL.REFUND".to_vec(), key.to_vec(), int(n)],
        Backend::Functions => vec![
            b"FCALL".to_vec(),
            b"rl_refund".to_vec(),
            b"1".to_vec(),
            key.to_vec(),
            int(n),
        ],
    }
}

/// What `RL.MTAKE` answered: `[granted, denied_by, retry_after_ms]`, and with `WITHSTATE`
/// each bucket's tokens left as a fourth element.
#[derive(Debug, Clone, PartialEq)]
pub struct MTakeReply {
    /// Tokens granted from every bucket (0: none).
    pub granted: u64,
    /// The key whose wait is longest, when refused.
    pub denied_by: Option<Vec<u8>>,
    pub retry_after_ms: u64,
    /// Tokens left in each bucket, in the command's order (`WITHSTATE` only).
    pub remaining: Option<Vec<f64>>,
}

/// An `RL.MTAKE` reply, for `buckets` keys (`None`: as many remaining counts as came);
/// anything else is a [`ProtocolError`].
pub fn parse_mtake(reply: &Reply, buckets: Option<usize>) -> Result<MTakeReply, ProtocolError> {
    const WHAT: &str = "RL.MTAKE";
    let items = reply.items(WHAT)?;
    if items.len() != 3 && items.len() != 4 {
        return Err(ProtocolError(format!(
            "{WHAT}: 3 or 4 elements expected, got {}",
            items.len()
        )));
    }
    let remaining = match items.get(3) {
        None | Some(Reply::Nil) => None,
        Some(r) => {
            let xs = r
                .items(WHAT)?
                .iter()
                .map(|x| x.number(WHAT))
                .collect::<Result<Vec<f64>, _>>()?;
            if buckets.is_some_and(|n| n != xs.len()) || xs.iter().any(|x| !x.is_finite()) {
                return Err(ProtocolError(format!(
                    "{WHAT}: {buckets:?} finite remaining counts expected, got {xs:?}"
                )));
            }
            Some(xs)
        }
    };
    Ok(MTakeReply {
        granted: items[0].count(WHAT)?,
        denied_by: items[1].bytes_or_nil(WHAT)?.map(<[u8]>::to_vec),
        retry_after_ms: items[2].count(WHAT)?,
        remaining,
    })
}

/// The cluster hash slot of a key (CRC16/XMODEM of its hash tag, or of the whole key).
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&c| c == b'{')
        .and_then(|s| {
            key[s + 1..]
                .iter()
                .position(|&c| c == b'}')
                .filter(|&e| e > 0)
                .map(|e| &key[s + 1..s + 1 + e])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A decision of a check.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleDecision {
    pub granted: bool,
    /// The deciding bucket's tokens left (never below 0).
    pub remaining: f64,
    /// The wait before a retry may be granted (0 when granted).
    pub retry_after_ms: u64,
    /// Until the deciding bucket is full again.
    pub reset_after_ms: u64,
    /// Tokens taken from each enforced bucket (0 when refused).
    pub tokens: u64,
    /// The deciding bucket's cap (`X-RateLimit-Limit`; 0 with no deciding bucket).
    pub limit: f64,
    /// The refusing layer, or when granted the binding one (fewest tokens left); `None`
    /// when no enforced layer applied or a fail-open decision.
    pub layer: Option<String>,
    /// The deciding layer's code.
    pub code: Option<String>,
    /// The deciding bucket's key.
    pub key: Option<String>,
    /// Shadow layers that would have refused.
    pub shadow_denied: Vec<String>,
    /// Decided without Redis (it failed): the failure policy's decision.
    pub fallback: bool,
}

/// A cost the check cannot take: the caller's mistake, found before any call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostError(pub String);

impl std::fmt::Display for CostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CostError {}

/// How a check is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckOptions {
    /// Tokens from every bucket (at least 1).
    pub cost: u64,
    /// A failure of Redis grants (`true`) or refuses.
    pub fail_open: bool,
    /// One `RL.MTAKE` per hash slot (a cluster connection) instead of one for all.
    pub cluster: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            cost: 1,
            fail_open: true,
            cluster: false,
        }
    }
}

#[derive(Debug, Clone)]
struct Bucket {
    key: String,
    rate: f64,
    cap: f64,
    /// `rate` and `cap` as sent (the layer's, formatted once).
    rate_text: Vec<u8>,
    cap_text: Vec<u8>,
    layer: usize,
}

#[derive(Debug, Clone)]
struct LayerRef {
    name: String,
    code: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Enforced(usize),
    Shadow(usize),
    Done,
}

/// One check in progress: [`Check::command`] says what to send, [`Check::reply`] /
/// [`Check::failed`] take what came, until [`Check::decision`] is there; then
/// [`Check::refunds`] are the calls that give back what was taken for nothing (send them
/// best effort: a refund lost costs its tokens until they refill, never mints any).
#[derive(Debug, Clone)]
pub struct Check {
    buckets: Vec<Bucket>,
    layers: Vec<LayerRef>,
    /// Enforced buckets by call (indices into `buckets`).
    groups: Vec<Vec<usize>>,
    /// Shadow layers' buckets, one call each: (layer, buckets).
    shadows: Vec<(usize, Vec<usize>)>,
    options: CheckOptions,
    step: Step,
    /// The binding bucket so far: (tokens left, bucket).
    best: Option<(f64, usize)>,
    shadow_denied: Vec<String>,
    /// Groups granted that a refusal or a failure gives back.
    refund_groups: usize,
    decision: Option<RuleDecision>,
}

impl Check {
    /// A check of `applied` (a plan). A cost no bucket could grant is refused here.
    pub fn new(applied: &[Applied<'_>], options: CheckOptions) -> Result<Check, CostError> {
        if options.cost < 1 {
            return Err(CostError("cost must be a positive integer".into()));
        }
        let mut buckets = Vec::new();
        let mut layers = Vec::with_capacity(applied.len());
        let mut enforced = Vec::new();
        let mut shadows = Vec::new();
        for (li, a) in applied.iter().enumerate() {
            layers.push(LayerRef {
                name: a.layer.name.clone(),
                code: a.layer.code.clone(),
            });
            let mut mine = Vec::with_capacity(a.buckets.len());
            for (n, b) in a.buckets.iter().enumerate() {
                let cap = b.limit.cap();
                let (rate_text, cap_text) = a
                    .layer
                    .numbers
                    .get(n)
                    .cloned()
                    .unwrap_or_else(|| (number(b.limit.rate()), number(cap)));
                if options.cost as f64 > cap {
                    return Err(CostError(format!(
                        "cost {} exceeds layer {}'s cap {cap}",
                        options.cost, a.layer.name
                    )));
                }
                mine.push(buckets.len());
                buckets.push(Bucket {
                    key: b.key.clone(),
                    rate: b.limit.rate(),
                    cap,
                    rate_text,
                    cap_text,
                    layer: li,
                });
            }
            if a.layer.shadow {
                if !mine.is_empty() {
                    shadows.push((li, mine));
                }
            } else {
                enforced.extend(mine);
            }
        }
        let groups = if enforced.is_empty() {
            Vec::new()
        } else if options.cluster {
            let mut by: Vec<(u16, Vec<usize>)> = Vec::new();
            for i in enforced {
                let s = slot(buckets[i].key.as_bytes());
                match by.iter_mut().find(|(x, _)| *x == s) {
                    Some((_, g)) => g.push(i),
                    None => by.push((s, vec![i])),
                }
            }
            by.into_iter().map(|(_, g)| g).collect()
        } else {
            vec![enforced]
        };
        let mut check = Check {
            buckets,
            layers,
            groups,
            shadows,
            options,
            step: Step::Enforced(0),
            best: None,
            shadow_denied: Vec::new(),
            refund_groups: 0,
            decision: None,
        };
        check.advance();
        Ok(check)
    }

    /// Skips to the next call to make, or decides when none is left.
    fn advance(&mut self) {
        loop {
            match self.step {
                Step::Enforced(g) if g < self.groups.len() => return,
                Step::Enforced(_) => self.step = Step::Shadow(0),
                Step::Shadow(s) if s < self.shadows.len() => return,
                Step::Shadow(_) => {
                    self.step = Step::Done;
                    self.decision = Some(self.granted());
                    return;
                }
                Step::Done => return,
            }
        }
    }

    fn bucket_args(&self, idx: &[usize]) -> Vec<(&[u8], &[u8], &[u8])> {
        idx.iter()
            .map(|&i| {
                let b = &self.buckets[i];
                (
                    b.key.as_bytes(),
                    b.rate_text.as_slice(),
                    b.cap_text.as_slice(),
                )
            })
            .collect()
    }

    /// The call to send now, or `None` once decided.
    pub fn command(&self, backend: Backend) -> Option<Vec<Vec<u8>>> {
        match self.step {
            Step::Enforced(g) => Some(mtake_texts(
                backend,
                &self.bucket_args(&self.groups[g]),
                self.options.cost,
                true,
            )),
            Step::Shadow(s) => Some(mtake_texts(
                backend,
                &self.bucket_args(&self.shadows[s].1),
                self.options.cost,
                false,
            )),
            Step::Done => None,
        }
    }

    /// The reply to the last [`Check::command`]. An error reply is a failure of Redis
    /// (the failure policy decides); a malformed one is returned (see the module's doc).
    pub fn reply(&mut self, reply: &Reply) -> Result<(), ProtocolError> {
        if let Reply::Error(_) = reply {
            self.failed();
            return Ok(());
        }
        let expected = match self.step {
            Step::Enforced(g) => self.groups[g].len(),
            Step::Shadow(s) => self.shadows[s].1.len(),
            Step::Done => return Ok(()), // nothing was asked: a stray reply changes nothing
        };
        let parsed = match parse_mtake(reply, Some(expected)) {
            Ok(r) => r,
            Err(e) => {
                match self.step {
                    Step::Enforced(_) => self.step = Step::Done,
                    _ => self.failed(),
                }
                return Err(e);
            }
        };
        match self.step {
            Step::Enforced(g) => {
                if parsed.granted == 0 {
                    self.refund_groups = g;
                    self.decision = Some(self.denied(g, &parsed));
                    self.step = Step::Done;
                    return Ok(());
                }
                for (n, &i) in self.groups[g].iter().enumerate() {
                    let b = &self.buckets[i];
                    let left = parsed.remaining.as_ref().map_or(b.cap, |r| r[n]);
                    if self.best.is_none_or(|(l, _)| left < l) {
                        self.best = Some((left, i));
                    }
                }
                self.refund_groups = g + 1;
                self.step = Step::Enforced(g + 1);
            }
            Step::Shadow(s) => {
                if parsed.granted == 0 {
                    let name = self.layers[self.shadows[s].0].name.clone();
                    self.shadow_denied.push(name);
                }
                self.step = Step::Shadow(s + 1);
            }
            Step::Done => {}
        }
        self.advance();
        Ok(())
    }

    /// The last [`Check::command`] got no reply (a connection lost, a timeout, a
    /// backend that could not be chosen). During the enforced calls, the failure policy
    /// decides and what earlier calls took is given back; during a shadow call, the
    /// shadow layer is skipped (it never changes a decision).
    pub fn failed(&mut self) {
        match self.step {
            Step::Enforced(_) => {
                self.decision = Some(self.fallback());
                self.step = Step::Done;
            }
            Step::Shadow(s) => {
                self.step = Step::Shadow(s + 1);
                self.advance();
            }
            Step::Done => {}
        }
    }

    /// The decision, once every call is answered (`None` after a malformed reply to an
    /// enforced call).
    pub fn decision(&self) -> Option<&RuleDecision> {
        self.decision.as_ref()
    }

    /// The calls that give back what was taken for nothing: the earlier groups of a
    /// refusal, a failure or a malformed reply (none after a grant, none before the end).
    pub fn refunds(&self, backend: Backend) -> Vec<Vec<Vec<u8>>> {
        match &self.decision {
            _ if self.step != Step::Done => Vec::new(),
            Some(d) if d.granted && !d.fallback => Vec::new(),
            _ => self.groups[..self.refund_groups]
                .iter()
                .flatten()
                .map(|&i| {
                    refund_command(backend, self.buckets[i].key.as_bytes(), self.options.cost)
                })
                .collect(),
        }
    }

    fn reset_ms(&self, b: &Bucket, left: f64) -> u64 {
        let ms = ((b.cap - left).max(0.0) * 1000.0 / b.rate).ceil();
        if ms.is_finite() {
            ms.min(u64::MAX as f64) as u64
        } else {
            0
        }
    }

    fn granted(&self) -> RuleDecision {
        let mut d = RuleDecision {
            granted: true,
            remaining: 0.0,
            retry_after_ms: 0,
            reset_after_ms: 0,
            tokens: self.options.cost,
            limit: 0.0,
            layer: None,
            code: None,
            key: None,
            shadow_denied: self.shadow_denied.clone(),
            fallback: false,
        };
        if let Some((left, i)) = self.best {
            let b = &self.buckets[i];
            let layer = &self.layers[b.layer];
            d.remaining = left.max(0.0);
            d.reset_after_ms = self.reset_ms(b, left);
            d.limit = b.cap;
            d.layer = Some(layer.name.clone());
            d.code = Some(layer.code.clone());
            d.key = Some(b.key.clone());
        }
        d
    }

    fn denied(&self, g: usize, reply: &MTakeReply) -> RuleDecision {
        let group = &self.groups[g];
        let n = reply
            .denied_by
            .as_deref()
            .and_then(|k| {
                group
                    .iter()
                    .position(|&i| self.buckets[i].key.as_bytes() == k)
            })
            .unwrap_or(0);
        let b = &self.buckets[group[n]];
        let left = reply.remaining.as_ref().map_or(0.0, |r| r[n]);
        let layer = &self.layers[b.layer];
        RuleDecision {
            granted: false,
            remaining: left.max(0.0),
            retry_after_ms: reply.retry_after_ms,
            reset_after_ms: self.reset_ms(b, left),
            tokens: 0,
            limit: b.cap,
            layer: Some(layer.name.clone()),
            code: Some(layer.code.clone()),
            key: Some(b.key.clone()),
            shadow_denied: Vec::new(),
            fallback: false,
        }
    }

    fn fallback(&self) -> RuleDecision {
        let first = self
            .groups
            .first()
            .map(|g| &self.layers[self.buckets[g[0]].layer]);
        let refuse = !self.options.fail_open && first.is_some();
        RuleDecision {
            granted: !refuse,
            remaining: 0.0,
            retry_after_ms: if refuse { FAIL_CLOSED_RETRY_MS } else { 0 },
            reset_after_ms: 0,
            tokens: if refuse { 0 } else { self.options.cost },
            limit: 0.0,
            layer: first.filter(|_| refuse).map(|l| l.name.clone()),
            code: first.filter(|_| refuse).map(|l| l.code.clone()),
            key: None,
            shadow_denied: Vec::new(),
            fallback: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots() {
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
    }
}
