//! The lease protocol's two commands: `RL.LEASE` (with an optional settlement of the
//! previous lease) and `RL.RETURN`.

use redis::{Cmd, Value};
use rl_core::Limit;

use crate::backend;
use crate::{reply, Backend, Error};

/// What `RL.LEASE` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    /// Tokens granted (0 = denied).
    pub(crate) tokens: u64,
    /// The lease's id, for `RETURN` / `RL.RETURN`.
    pub(crate) id: u64,
    /// The TTL the server applied.
    pub(crate) ttl_ms: u64,
    /// When denied: how long until `MIN` tokens are there.
    pub(crate) retry_after_ms: u64,
}

/// `RL.LEASE key rate cap n ttl_ms MIN min [RETURN id unused]`.
pub(crate) fn lease_cmd(
    backend: Backend,
    key: &str,
    limit: &Limit,
    n: u64,
    ttl_ms: u64,
    min: u64,
    settle: Option<(u64, u64)>,
) -> Cmd {
    let mut cmd = backend::cmd(backend, "RL.LEASE");
    cmd.arg(key)
        .arg(limit.rate())
        .arg(limit.cap())
        .arg(n)
        .arg(ttl_ms)
        .arg("MIN")
        .arg(min);
    if let Some((id, unused)) = settle {
        cmd.arg("RETURN").arg(id).arg(unused);
    }
    cmd
}

/// `RL.RETURN key id unused`.
pub(crate) fn return_cmd(backend: Backend, key: &str, id: u64, unused: u64) -> Cmd {
    let mut cmd = backend::cmd(backend, "RL.RETURN");
    cmd.arg(key).arg(id).arg(unused);
    cmd
}

pub(crate) fn parse_lease(v: Value) -> Result<LeaseReply, Error> {
    let items = reply::array(v, 4)?;
    Ok(LeaseReply {
        tokens: reply::count(&items[0])?,
        id: reply::count(&items[1])?,
        ttl_ms: reply::count(&items[2])?,
        retry_after_ms: reply::count(&items[3])?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlement_rides_on_the_lease_call() {
        let limit = Limit::new(10.0, 100.0).unwrap();
        let cmd = lease_cmd(Backend::Module, "k", &limit, 20, 1000, 1, Some((7, 3)));
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Arg::Cursor => "?".into(),
            })
            .collect();
        assert_eq!(args[0], "RL.LEASE");
        assert_eq!(args[4..], ["20", "1000", "MIN", "1", "RETURN", "7", "3"]);
    }

    #[test]
    fn lease_reply_parses() {
        let v = Value::Array(vec![
            Value::Int(5),
            Value::Int(42),
            Value::Int(1000),
            Value::Int(0),
        ]);
        let r = parse_lease(v).unwrap();
        assert_eq!((r.tokens, r.id, r.ttl_ms), (5, 42, 1000));
    }
}
