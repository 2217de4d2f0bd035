//! `RL.DEBUG-PANIC`, in debug builds only: panics inside a command, so the tests can show
//! the boundary answers an error and the server lives on.

use crate::api::Ctx;
use crate::args::Args;
use crate::error::Result;

pub fn debug_panic(_ctx: *mut Ctx, _args: Args) -> Result<()> {
    panic!("RL.DEBUG-PANIC asked for a panic");
}
