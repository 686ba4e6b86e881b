//! zygote daemon
