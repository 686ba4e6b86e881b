//! zygote-client
