#if canImport(Glibc)
import Glibc
#endif

/// One-time initialization, the safe replacement for double-checked locking:
/// Spindle's `pthread_once` and `dispatch_once`.
///
/// `run(_:)` runs its body exactly once per `Once`, however many threads call
/// it at the same time: the first caller runs it, the others sleep on a futex
/// until it finishes, and every later call returns at once after a single
/// acquiring load. Everything the body wrote is visible to every thread that
/// returns from `run` (the completing store releases, that load acquires),
/// which is exactly what a hand-written double-checked lock gets wrong.
///
/// If the body throws, the error reaches its caller, the `Once` goes back to
/// not-done, and one of the waiting threads (or the next caller) runs its own
/// body. Misuse: calling `run` on the same `Once` from inside its body would
/// deadlock; it stops the process with a message instead. `Once` is a handle:
/// copies share one state.
public struct Once: @unchecked Sendable {
    // @unchecked: the state word and the runner are only accessed atomically.

    /// The state word.
    ///
    ///     0 new       nobody has run the body
    ///     1 running   a thread runs it, nobody waits
    ///     2 waited    a thread runs it, others sleep on the word
    ///     3 done
    @usableFromInline static var new: UInt32 { 0 }
    @usableFromInline static var running: UInt32 { 1 }
    @usableFromInline static var waited: UInt32 { 2 }
    @usableFromInline static var done: UInt32 { 3 }

    @usableFromInline
    final class Storage: ManagedBuffer<UInt, UInt32> {}
    // Header: pthread_self() of the thread running the body, or 0.

    @usableFromInline let storage: Storage
    @usableFromInline let word: UnsafeMutablePointer<UInt32>
    @usableFromInline let runner: UnsafeMutablePointer<UInt>

    /// A `Once` whose body has not run.
    public init() {
        let buffer = Storage.create(minimumCapacity: 1) { _ in 0 }
        storage = unsafeDowncast(buffer, to: Storage.self)
        word = storage.withUnsafeMutablePointerToElements { $0 }
        word.initialize(to: 0)
        runner = storage.withUnsafeMutablePointerToHeader { $0 }
    }

    /// Whether a body has completed. Never blocks; acquiring.
    @inlinable
    public var isDone: Bool { AtomicMemory.load(from: word, ordering: .acquiring) == Self.done }

    /// Runs `body` if no call has completed it yet; otherwise returns at once.
    /// Blocks while another thread is running its body.
    @inlinable
    public func run<Failure: Error>(_ body: () throws(Failure) -> Void) throws(Failure) {
        // Pairs with the releasing exchange that marks the state done.
        if AtomicMemory.load(from: word, ordering: .acquiring) == Self.done { return }
        try runSlow(body)
    }

    @usableFromInline
    func runSlow<Failure: Error>(_ body: () throws(Failure) -> Void) throws(Failure) {
        let me = UInt(bitPattern: Int(bitPattern: pthread_self()))
        var state = AtomicMemory.load(from: word, ordering: .acquiring)
        while true {
            switch state {
            case Self.done:
                return
            case Self.new:
                let r = AtomicMemory.compareExchange(expected: Self.new, desired: Self.running, at: word, ordering: .acquiring)
                if !r.exchanged { state = r.original; continue }
                AtomicMemory.store(me, to: runner, ordering: .relaxed)
                do {
                    try body()
                } catch {
                    finish(with: Self.new)
                    throw error
                }
                finish(with: Self.done)
                return
            default:
                require(
                    AtomicMemory.load(from: runner, ordering: .relaxed) != me,
                    "Once.run: called again from inside its own body on the same thread (this would deadlock)")
                if state == Self.running {
                    // Acquiring, because a failed exchange may report `done`
                    // and the loop then returns on it: that observation must
                    // see everything the body wrote.
                    let r = AtomicMemory.compareExchange(expected: Self.running, desired: Self.waited, at: word, ordering: .acquiring)
                    if !r.exchanged { state = r.original; continue }
                }
                _ = announcingBlocking { Futex(word).wait(expecting: Self.waited) }
                state = AtomicMemory.load(from: word, ordering: .acquiring)
            }
        }
    }

    /// Leaves the running state for `final` (done, or new after a throw) and
    /// wakes every sleeper. Releasing: pairs with the waiters' acquiring loads.
    @usableFromInline
    func finish(with final: UInt32) {
        AtomicMemory.store(0, to: runner, ordering: .relaxed)
        if AtomicMemory.exchange(final, at: word, ordering: .releasing) == Self.waited {
            Futex(word).wakeAll()
        }
    }
}
