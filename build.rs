// refinery embeds `migrations/` at compile time; tell cargo to rebuild when a file there changes.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
