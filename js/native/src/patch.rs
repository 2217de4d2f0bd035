//! Commands handed to JS as a patch of the last one. Making a JS string costs Node about
//! 80 ns, and a budget's command has a dozen arguments of which only the costs change from
//! call to call (a middleware's take, only the key): the binding keeps the last command it
//! handed over and hands over only the arguments that differ, with their positions. The
//! shell copies its last array and writes those in; it decides nothing.

use crate::guard::invalid;
use crate::strings;

/// Written into `positions[0]` when the strings returned are the whole command (the first
/// one, or one of another length than the last).
pub const WHOLE: u32 = u32::MAX;

/// The last command handed over for each of `N` shapes (the backends).
pub struct LastCommands<const N: usize> {
    last: [Option<Vec<Vec<u8>>>; N],
}

impl<const N: usize> Default for LastCommands<N> {
    fn default() -> Self {
        LastCommands {
            last: std::array::from_fn(|_| None),
        }
    }
}

impl<const N: usize> LastCommands<N> {
    /// The arguments of `args` that differ from the last command of `slot`, their positions
    /// into `positions[1..]` and their count into `positions[0]`; or all of them (`WHOLE`)
    /// when the shell holds no last command (`have` false) or the shapes differ.
    pub fn patch(
        &mut self,
        slot: usize,
        args: Vec<Vec<u8>>,
        have: bool,
        positions: &mut [u32],
    ) -> napi::Result<Vec<String>> {
        if positions.is_empty() {
            return Err(invalid("a Uint32Array of at least 1 expected"));
        }
        let last = self
            .last
            .get_mut(slot)
            .ok_or_else(|| invalid("no such command slot"))?;
        let same_shape = matches!(last, Some(l) if have && l.len() == args.len())
            && args.len() < positions.len();
        let out = if same_shape {
            let prev = last.as_ref().map(Vec::as_slice).unwrap_or_default();
            let mut changed = Vec::new();
            let mut n = 0;
            for (i, (a, p)) in args.iter().zip(prev).enumerate() {
                if a != p {
                    n += 1;
                    positions[n] = i as u32;
                    changed.push(a.clone());
                }
            }
            positions[0] = n as u32;
            strings(changed)
        } else {
            positions[0] = WHOLE;
            strings(args.clone())
        };
        *last = Some(args);
        Ok(out)
    }
}
