//! Sets the linker flags a Node-API addon needs on the platforms that want them.
fn main() {
    napi_build::setup();
}
