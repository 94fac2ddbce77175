//! Integration tests of kstack's built artifacts and Windows deliverables
//! (see `tests/`): they read the package folder that `cargo xtask test`
//! builds and names in `KSTACK_PACKAGE_DIR`. The library part is where
//! those folders are, the Wine host the end-to-end tests and `cargo xtask
//! demo` share, and the INF reader the Windows deliverables test uses.

pub mod folders;
pub mod inf;
pub mod stack_bounds;
pub mod wine_host;
