// The planted race. scripts/test builds this with ThreadSanitizer and fails
// unless TSan reports a data race here: a silent TSan run of the stress suite
// only means something if TSan is known to be watching.
//
// Two threads increment one plain (non-atomic) counter with no lock.
#if canImport(Glibc)
import Glibc
#endif

final class Counter: @unchecked Sendable {
    // @unchecked on purpose: this is the bug TSan must catch.
    var value = 0
}

let counter = Counter()
var threads: [pthread_t] = []
for _ in 0..<2 {
    var thread = pthread_t()
    let box = Unmanaged.passRetained(counter).toOpaque()
    let rc = pthread_create(&thread, nil, { arg in
        let c = Unmanaged<Counter>.fromOpaque(arg!).takeRetainedValue()
        for _ in 0..<10_000 { c.value += 1 }
        return nil
    }, box)
    precondition(rc == 0, "pthread_create failed: \(rc)")
    threads.append(thread)
}
for t in threads { pthread_join(t, nil) }
print("TSanCanary: counter = \(counter.value) (a data race, on purpose)")
