import CShims
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Whether this process may set up an io_uring, and if not why (Docker's
/// default seccomp profile answers EPERM; kernel.io_uring_disabled=2 too).
private let uringRefusal: String? = {
    var error: Int32 = 0
    guard let ring = cshims_uring_create(4, 0, &error) else {
        switch -error {
        case EPERM: return "io_uring refused with EPERM (seccomp profile or kernel.io_uring_disabled)"
        case ENOSYS: return "this kernel has no io_uring (ENOSYS)"
        default: return "io_uring_setup failed: errno \(-error)"
        }
    }
    cshims_uring_destroy(ring)
    return nil
}()

@Suite("CShims: io_uring")
struct URingTests {
    @Test(.enabled(if: uringRefusal == nil, Comment(rawValue: uringRefusal ?? "")))
    func oneMillisecondTimeoutCompletes() throws {
        var error: Int32 = 0
        let ring = try #require(cshims_uring_create(8, 0, &error))
        defer { cshims_uring_destroy(ring) }
        #expect(cshims_uring_fd(ring) >= 0)

        let start = cshims_monotonic_now_ns()
        #expect(cshims_uring_submit_timeout(ring, 1_000_000, 0xC0FFEE) == 1)
        var userData: UInt64 = 0
        var result: Int32 = 0
        var rc: Int32
        repeat { rc = cshims_uring_wait_completion(ring, &userData, &result) } while rc == -EINTR
        #expect(rc == 0)
        #expect(userData == 0xC0FFEE)
        #expect(result == -ETIME, "an expired timeout completes with -ETIME")
        #expect(cshims_monotonic_now_ns() - start >= 1_000_000)
    }

    @Test(.enabled(if: uringRefusal == nil, Comment(rawValue: uringRefusal ?? "")))
    func probeKnowsBasicOpcodes() throws {
        var error: Int32 = 0
        let ring = try #require(cshims_uring_create(4, 0, &error))
        defer { cshims_uring_destroy(ring) }
        #expect(cshims_uring_opcode_supported(ring, 0) == 1, "IORING_OP_NOP")
        #expect(cshims_uring_opcode_supported(ring, 11) == 1, "IORING_OP_TIMEOUT")
        // The futex opcodes (kernel 6.7+) may or may not be there; the probe
        // must answer 0 or 1, never fail.
        let futexWait = cshims_uring_opcode_supported(ring, CSHIMS_IORING_OP_FUTEX_WAIT)
        #expect(futexWait == 0 || futexWait == 1)
        #expect(cshims_uring_opcode_supported(ring, 255) == 0)
    }
}
