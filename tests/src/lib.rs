//! Integration tests of kstack's built artifacts (see `tests/`): they read
//! the package folder that `cargo xtask test` builds and names in
//! `KSTACK_PACKAGE_DIR`. The library part is the Wine host the end-to-end
//! tests and `cargo xtask demo` share.

pub mod wine_host;
