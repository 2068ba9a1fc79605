//! The `pthread_atfork` hooks, registered when the runtime starts: `fork` keeps copy semantics
//! (see `rackmem_runtime::fork_*`), and the C library's allocations during it stay local.

use crate::heap::set_inside;

pub(crate) extern "C" fn atfork_prepare() {
    set_inside(true);
    rackmem_runtime::fork_prepare();
}

pub(crate) extern "C" fn atfork_parent() {
    rackmem_runtime::fork_parent();
    set_inside(false);
}

pub(crate) extern "C" fn atfork_child() {
    rackmem_runtime::fork_child();
    set_inside(false);
}
