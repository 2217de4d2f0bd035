//! `RL.DEBUG-PANIC`, in debug builds only: panics inside a command, so the tests can show
//! the boundary answers an error and the server lives on.

use crate::args::Args;
use crate::error::Result;
use crate::ffi::Ctx;

pub fn debug_panic(_ctx: Ctx, _args: Args) -> Result<crate::reply::Reply> {
    panic!("RL.DEBUG-PANIC asked for a panic");
}
