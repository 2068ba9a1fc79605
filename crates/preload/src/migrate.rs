//! The migration functions of `include/rackmem.h`: `rackmem_migrate`, `rackmem_migrate_timed`
//! and `rackmem_unpin` (the runtime's `migrate` module does the work).

use crate::{runtime, set_errno, Inside};
use libc::{c_char, c_int, c_void, size_t};
use rackmem_runtime::migrate::MigrationTimes;
use rackmem_runtime::CallGuard;
use std::ffi::CStr;

/// The four step times of a migration, for `rackmem_migrate_timed` (see `include/rackmem.h`).
#[repr(C)]
pub struct RackmemMigration {
    /// Setup step, ns.
    pub setup_ns: u64,
    /// Allocate step, ns.
    pub allocate_ns: u64,
    /// Transfer step, ns.
    pub transfer_ns: u64,
    /// Finalize step, ns.
    pub finalize_ns: u64,
    /// Bytes carried.
    pub bytes: u64,
}

fn migrate(addr: *mut c_void, len: size_t, target: *const c_char) -> Result<MigrationTimes, c_int> {
    let Some(rt) = runtime() else {
        return Err(libc::ENOSYS);
    };
    if target.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a NUL-terminated string (checked non-null above).
    let target = unsafe { CStr::from_ptr(target) };
    let Ok(target) = target.to_str() else {
        return Err(libc::ENOENT);
    };
    let _call = CallGuard::enter();
    let _inside = Inside::enter();
    let to = rt.migration_target(target).map_err(|e| e.errno())?;
    rt.migrate(addr as usize, len, &to).map_err(|e| {
        if rt.config().verbose {
            eprintln!("rackmem: rackmem_migrate: {e}");
        }
        e.errno()
    })
}

/// Moves `[addr, addr+len)` to `target` ("local" or a brick address); 0, or -1 and errno.
#[no_mangle]
pub extern "C" fn rackmem_migrate(addr: *mut c_void, len: size_t, target: *const c_char) -> c_int {
    match migrate(addr, len, target) {
        Ok(_) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// As `rackmem_migrate`, filling `out` (if not NULL) with the step times.
///
/// # Safety
/// `out` is NULL or points to a writable `struct rackmem_migration`.
#[no_mangle]
pub unsafe extern "C" fn rackmem_migrate_timed(
    addr: *mut c_void,
    len: size_t,
    target: *const c_char,
    out: *mut RackmemMigration,
) -> c_int {
    match migrate(addr, len, target) {
        Ok(t) => {
            if !out.is_null() {
                // SAFETY: the caller passes a valid pointer to a struct rackmem_migration.
                unsafe {
                    *out = RackmemMigration {
                        setup_ns: t.setup_ns,
                        allocate_ns: t.allocate_ns,
                        transfer_ns: t.transfer_ns,
                        finalize_ns: t.finalize_ns,
                        bytes: t.bytes,
                    };
                }
            }
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Ends the pin `rackmem_migrate(..., "local")` made; 0, or -1 and errno.
#[no_mangle]
pub extern "C" fn rackmem_unpin(addr: *mut c_void, len: size_t) -> c_int {
    let Some(rt) = runtime() else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    let _call = CallGuard::enter();
    match rt.unpin(addr as usize, len) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e.errno());
            -1
        }
    }
}
