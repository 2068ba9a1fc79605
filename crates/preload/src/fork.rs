//! The `pthread_atfork` hooks, registered when the runtime starts: `fork` keeps copy semantics
//! (see `rackmem_runtime::fork_*`), and the C library's allocations during it stay local.

use crate::INSIDE;

pub(crate) extern "C" fn atfork_prepare() {
    INSIDE.with(|f| f.set(true));
    rackmem_runtime::fork_prepare();
}

pub(crate) extern "C" fn atfork_parent() {
    rackmem_runtime::fork_parent();
    INSIDE.with(|f| f.set(false));
}

pub(crate) extern "C" fn atfork_child() {
    rackmem_runtime::fork_child();
    INSIDE.with(|f| f.set(false));
}
