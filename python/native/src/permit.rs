//! The semaphore's failure policy (`redis_rl.permit` / `apermit`): the client core's
//! [`LocalPermits`] under Python, the Rust client's `Semaphore`'s too. Python calls it under
//! its own lock (which its fork handler replaces in a child); it holds none.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use rl_client_core::permit::{Local, LocalPermits as Core, Policy};

use crate::guard::guarded;

/// The local permits of this process while Redis is unavailable.
#[pyclass(module = "redis_rl._core")]
pub struct LocalPermits {
    inner: Core,
}

#[pymethods]
impl LocalPermits {
    /// `policy`: `allow`, `last_known` or `deny`; `instances`: the processes sharing each
    /// key's limit.
    #[new]
    fn new(policy: &str, instances: u32, deny_retry_after_ms: u64) -> PyResult<LocalPermits> {
        guarded(|| {
            let policy = match policy {
                "allow" => Policy::Allow,
                "last_known" => Policy::LastKnown,
                "deny" => Policy::Deny,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "unknown failure policy {other:?}"
                    )))
                }
            };
            Ok(LocalPermits {
                inner: Core::new(policy, instances, deny_retry_after_ms),
            })
        })
    }

    /// A local permit of `key` (of `limit`): `(granted, in_use, retry_after_ms)`.
    fn acquire(&mut self, key: &str, limit: u64) -> PyResult<(bool, u64, u64)> {
        guarded(|| {
            Ok(match self.inner.acquire(key, limit) {
                Local::Granted { in_use } => (true, in_use, 0),
                Local::Busy {
                    in_use,
                    retry_after_ms,
                } => (false, in_use, retry_after_ms),
            })
        })
    }

    /// A local permit of `key` let go.
    fn release(&mut self, key: &str) -> PyResult<()> {
        guarded(|| {
            self.inner.release(key);
            Ok(())
        })
    }

    /// Local permits of `key` held now.
    fn held(&self, key: &str) -> PyResult<u64> {
        guarded(|| Ok(self.inner.held(key)))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LocalPermits>()
}
