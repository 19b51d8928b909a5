import Spindle
import Testing

/// Misuse stops the process with a message naming the argument; each case runs
/// in a child process (an exit test) and the message is checked.
@Suite("AtomicMemory misuse")
struct AtomicMisuseTests {
    @Test func misaligned64BitAddressNamesTheArgument() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let raw = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8)
            _ = AtomicMemory.add(1, to: raw + 4, as: Int64.self)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("AtomicMemory.add(_:to:): `address`"))
        #expect(stderr.contains("is not 8-byte aligned"))
    }

    @Test func misaligned32BitCompareAndSwap() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let raw = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8)
            _ = AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: raw + 2, as: UInt32.self)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("`address`"))
        #expect(stderr.contains("is not 4-byte aligned"))
    }

    @Test func testAndSetBeyondTheBufferNamesTheBit() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 4, alignment: 4)
            _ = AtomicMemory.testAndSet(bit: 32, in: buffer)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("AtomicMemory.testAndSet(bit:in:): `bit` 32 is outside the buffer's 32 bits"))
    }

    @Test func negativeBitIsRejected() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 4, alignment: 4)
            _ = AtomicMemory.testAndClear(bit: -1, in: buffer)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("`bit` -1 is outside the buffer"))
    }

    @Test func misalignedFutexWordIsRejected() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let raw = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8)
            _ = Futex((raw + 2).assumingMemoryBound(to: UInt32.self))
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("Futex.init: `word`"))
        #expect(stderr.contains("is not 4-byte aligned"))
    }
}
