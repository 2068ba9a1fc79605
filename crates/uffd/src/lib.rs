//! rackmem uffd (placeholder)
