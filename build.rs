// sqlx embeds migrations (`migrate!`) and query files (`query_file!`) at
// compile time; rebuild when they change, not only when Rust sources do.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=sql");
}
