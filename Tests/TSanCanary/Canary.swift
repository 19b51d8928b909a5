// The planted race. scripts/test builds this with ThreadSanitizer and fails
// unless TSan reports a data race here: a silent TSan run of the stress suite
// only means something if TSan is known to be watching.
//
// Two threads increment one plain (non-atomic) counter with no lock.
#if canImport(Glibc)
import Glibc
#endif

final class Counter: @unchecked Sendable {
    // @unchecked on purpose: this unsynchronized field is the bug TSan must catch.
    var value = 0
}

/// A pthread entry point (nonisolated, unlike closures in top-level code).
func incrementWithoutALock(_ arg: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let counter = Unmanaged<Counter>.fromOpaque(arg!).takeUnretainedValue()
    for _ in 0..<10_000 { counter.value += 1 }
    return nil
}

@main
enum TSanCanary {
    static func main() {
        let counter = Counter()
        let arg = Unmanaged.passUnretained(counter).toOpaque()
        var threads: [pthread_t] = []
        for _ in 0..<2 {
            var thread = pthread_t()
            let rc = pthread_create(&thread, nil, incrementWithoutALock, arg)
            precondition(rc == 0, "pthread_create failed: \(rc)")
            threads.append(thread)
        }
        for thread in threads { pthread_join(thread, nil) }
        print("TSanCanary: counter = \(counter.value) (raced on purpose)")
    }
}
