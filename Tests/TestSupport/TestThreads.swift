// Raw threads for tests: N pthreads that start together and are all joined
// before the call returns. Tests use these rather than Dispatch so that the
// thread count is exactly what the test asks for (Dispatch caps its pool at
// the core count).
#if canImport(Glibc)
import Glibc
#endif

private final class ThreadStart: @unchecked Sendable {
    // @unchecked: `body` and `index` are written before pthread_create and
    // only read by the new thread afterwards (pthread_create orders them).
    let body: @Sendable (Int) -> Void
    let index: Int
    init(_ body: @escaping @Sendable (Int) -> Void, _ index: Int) {
        self.body = body
        self.index = index
    }
}

/// Runs `body(i)` on `count` new threads (i = 0..<count) and returns when all
/// have finished.
public func runThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    var threads: [pthread_t] = []
    threads.reserveCapacity(count)
    for i in 0..<count {
        var thread = pthread_t()
        let start = Unmanaged.passRetained(ThreadStart(body, i)).toOpaque()
        let rc = pthread_create(&thread, nil, { raw in
            let start = Unmanaged<ThreadStart>.fromOpaque(raw!).takeRetainedValue()
            start.body(start.index)
            return nil
        }, start)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        threads.append(thread)
    }
    for thread in threads { pthread_join(thread, nil) }
}

/// Starts one thread running `body` and returns a function that joins it.
public func startThread(_ body: @escaping @Sendable () -> Void) -> () -> Void {
    var thread = pthread_t()
    let start = Unmanaged.passRetained(ThreadStart({ _ in body() }, 0)).toOpaque()
    let rc = pthread_create(&thread, nil, { raw in
        let start = Unmanaged<ThreadStart>.fromOpaque(raw!).takeRetainedValue()
        start.body(start.index)
        return nil
    }, start)
    precondition(rc == 0, "pthread_create failed: \(rc)")
    return { pthread_join(thread, nil) }
}

/// A word-aligned heap allocation of `count` zeroed elements, freed by `body`'s end.
public func withZeroedWords<T: FixedWidthInteger, R>(
    _ type: T.Type, count: Int, _ body: (UnsafeMutablePointer<T>) throws -> R
) rethrows -> R {
    let p = UnsafeMutablePointer<T>.allocate(capacity: count)
    p.initialize(repeating: 0, count: count)
    defer { p.deallocate() }
    return try body(p)
}

/// A `Sendable` box for a raw pointer that tests share between threads; the
/// memory it points to is only touched atomically.
public struct SharedPointer<T>: @unchecked Sendable {
    public let pointer: UnsafeMutablePointer<T>
    public init(_ pointer: UnsafeMutablePointer<T>) { self.pointer = pointer }
}

/// A `Sendable` box for a reference that tests hand to other threads: a
/// Spindle type whose cross-thread API is thread-safe (a loop, a timer, a
/// backend), or an object used only for its identity.
public struct Unchecked<Value>: @unchecked Sendable {
    // @unchecked: tests only call the boxed value's thread-safe API, or use
    // its identity.
    public let value: Value
    public init(_ value: Value) { self.value = value }
}
