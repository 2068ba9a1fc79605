//! The set of userfaultfd features a caller asks for and the kernel offers.

use linux_raw_sys::general as sys;
use std::fmt;

/// A set of userfaultfd features (`UFFD_FEATURE_*`), combined with `|`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features(pub u64);

macro_rules! features {
    ($($name:ident = $val:expr),* $(,)?) => {
        impl Features {
            $(
                #[doc = concat!("`UFFD_FEATURE_", stringify!($name), "`.")]
                pub const $name: Features = Features($val as u64);
            )*
            const NAMES: &'static [(&'static str, u64)] = &[$((stringify!($name), $val as u64)),*];
        }
    };
}

features! {
    PAGEFAULT_FLAG_WP = sys::UFFD_FEATURE_PAGEFAULT_FLAG_WP,
    EVENT_FORK = sys::UFFD_FEATURE_EVENT_FORK,
    EVENT_REMAP = sys::UFFD_FEATURE_EVENT_REMAP,
    EVENT_REMOVE = sys::UFFD_FEATURE_EVENT_REMOVE,
    MISSING_HUGETLBFS = sys::UFFD_FEATURE_MISSING_HUGETLBFS,
    MISSING_SHMEM = sys::UFFD_FEATURE_MISSING_SHMEM,
    EVENT_UNMAP = sys::UFFD_FEATURE_EVENT_UNMAP,
    SIGBUS = sys::UFFD_FEATURE_SIGBUS,
    THREAD_ID = sys::UFFD_FEATURE_THREAD_ID,
    MINOR_HUGETLBFS = sys::UFFD_FEATURE_MINOR_HUGETLBFS,
    MINOR_SHMEM = sys::UFFD_FEATURE_MINOR_SHMEM,
    EXACT_ADDRESS = sys::UFFD_FEATURE_EXACT_ADDRESS,
    WP_HUGETLBFS_SHMEM = sys::UFFD_FEATURE_WP_HUGETLBFS_SHMEM,
    WP_UNPOPULATED = sys::UFFD_FEATURE_WP_UNPOPULATED,
    POISON = sys::UFFD_FEATURE_POISON,
    WP_ASYNC = sys::UFFD_FEATURE_WP_ASYNC,
    MOVE = sys::UFFD_FEATURE_MOVE,
}

impl Features {
    /// No feature.
    pub const fn empty() -> Features {
        Features(0)
    }

    /// The raw `UFFD_FEATURE_*` bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// True if every feature of `other` is in `self`.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if no feature is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The features of `self` that are not in `other`.
    pub const fn difference(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        Features(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for Features {
    fn bitor_assign(&mut self, rhs: Features) {
        self.0 |= rhs.0;
    }
}

impl std::ops::BitAnd for Features {
    type Output = Features;
    fn bitand(self, rhs: Features) -> Features {
        Features(self.0 & rhs.0)
    }
}

/// Names the features, `|`-separated (`WP_ASYNC|MOVE`); bits this crate does not know are shown
/// in hex; the empty set is `(none)`.
impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("(none)");
        }
        let mut known = 0u64;
        let mut first = true;
        for (name, bit) in Self::NAMES {
            if self.0 & bit != 0 {
                known |= bit;
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        let unknown = self.0 & !known;
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{unknown:#x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_display_names_and_unknown_bits() {
        assert_eq!(Features::empty().to_string(), "(none)");
        assert_eq!((Features::MOVE | Features::WP_ASYNC).to_string(), "WP_ASYNC|MOVE");
        assert_eq!(
            (Features::POISON | Features(1 << 40)).to_string(),
            "POISON|0x10000000000"
        );
        assert!((Features::MOVE | Features::POISON).contains(Features::MOVE));
        assert!(!Features::MOVE.contains(Features::MOVE | Features::POISON));
    }
}
