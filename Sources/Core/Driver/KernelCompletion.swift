/// One completion a backend read from the kernel.
package struct KernelCompletion: Sendable, Hashable {
    /// The watch's key.
    var key: UInt64
    /// Readiness bits (≥ 0), or -errno for a watch the kernel ended with an
    /// error (io_uring's -EBADF for a descriptor closed under its poll).
    var result: Int32
}
