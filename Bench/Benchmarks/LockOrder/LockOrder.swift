// The lock-order checker's cost when it is on (SPINDLE_LOCK_ORDER=1 or
// LockOrder.enable()), in a benchmark target of its own: the checker cannot
// be switched off again, and the Locks target measures the locks with it
// off (where it costs one relaxed load per acquisition).
//
// Groups (`scripts/bench --target LockOrder`):
//
// - lockorder.uncontended: one Lock, acquire and release, nothing held
//   around it: the checker records and forgets one hold per pair.
// - lockorder.nested pair: an outer Lock held while an inner one is
//   acquired and released: one edge, checked once, then found in the
//   thread's chain cache on every later pair.
// - lockorder.fresh nesting: an outer Lock held while a Lock made for the
//   iteration is acquired and released, then freed: a new edge every time
//   (searched for a cycle, the acquisition's place captured) and a node
//   forgotten, as in a program that locks freshly made objects. Its
//   reference makes and nests a fresh Mutex the same way.
//
// The reference in both is Synchronization.Mutex doing the same, which no
// checker sees; the Locks target's lock.uncontended group measures the same
// Lock with the checker off.
import Benchmark
import BenchSupport
import Spindle
import Synchronization

let benchmarks: @Sendable () -> Void = {
    // On before any Spindle lock is taken, in whichever process runs these.
    LockOrder.enable()
    let settings = RunSettings(maxDuration: .milliseconds(250))

    do {
        let lock = Spindle.Lock()
        let mutex = allocateOnOwnCacheLine(Mutex(()))
        sideBySide(
            group: "lockorder.uncontended",
            settings: settings,
            spindle: { benchmark in
                LockOrder.enable()
                benchmark.repeatOperation {
                    lock.lock()
                    lock.unlock()
                }
            },
            peers: [
                .reference("Synchronization.Mutex") { benchmark in
                    benchmark.repeatOperation { mutex.pointee.withLock { _ in } }
                },
            ]
        )
    }

    do {
        let outer = Spindle.Lock()
        let inner = Spindle.Lock()
        let outerMutex = allocateOnOwnCacheLine(Mutex(()))
        let innerMutex = allocateOnOwnCacheLine(Mutex(()))
        sideBySide(
            group: "lockorder.nested pair",
            settings: settings,
            spindle: { benchmark in
                LockOrder.enable()
                benchmark.repeatOperation {
                    outer.lock()
                    inner.lock()
                    inner.unlock()
                    outer.unlock()
                }
            },
            peers: [
                .reference("Synchronization.Mutex") { benchmark in
                    benchmark.repeatOperation {
                        outerMutex.pointee.withLock { _ in innerMutex.pointee.withLock { _ in } }
                    }
                },
            ]
        )
    }

    do {
        let outer = Spindle.Lock()
        let outerMutex = allocateOnOwnCacheLine(Mutex(()))
        sideBySide(
            group: "lockorder.fresh nesting",
            settings: settings,
            spindle: { benchmark in
                LockOrder.enable()
                benchmark.repeatOperation {
                    let inner = Spindle.Lock()
                    outer.lock()
                    inner.lock()
                    inner.unlock()
                    outer.unlock()
                }
            },
            peers: [
                .reference("Synchronization.Mutex") { benchmark in
                    benchmark.repeatOperation {
                        let inner = FreshMutex()
                        outerMutex.pointee.withLock { _ in inner.mutex.withLock { _ in } }
                    }
                },
            ]
        )
    }
}

/// A Mutex on the heap, made for one iteration (as `Spindle.Lock`, a class,
/// is).
final class FreshMutex: Sendable {
    let mutex = Mutex(())
}
