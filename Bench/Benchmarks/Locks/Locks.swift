// Spindle's locks beside what a user would pick instead: pthread, Foundation,
// Synchronization.Mutex and NIOLock.
//
// Groups (every name holds "lock", so `scripts/bench --filter lock` runs them all):
//
// - <lock>.uncontended, lock.once done, lock.synchronized uncontended: one
//   thread, one lock, acquire and release in a loop (1,000 pairs per
//   measured iteration); what an uncontended caller pays. Nothing happens
//   inside the lock, except in the synchronized group, whose peers run the
//   same increment inside.
// - lock.value uncontended: LockedValue's withLock around an increment,
//   beside Mutex<Int> and NIOLockedValueBox (see LockedValues.swift).
// - <lock>.create: making 1,000 locks, kept alive until the measurement
//   ends; the time per lock, and the heap each takes (allocations and bytes
//   requested from malloc per lock, counted by package-benchmark's malloc
//   interposer). A lock whose storage is a value (pthread_mutex_t, Mutex) is
//   created where a user would put it on the heap: a malloc'ed pthread_mutex_t,
//   and a Mutex in the smallest object that can own one.
// - lock.contended N threads: throughput and fairness of N threads
//   incrementing one counter under one lock, N = 2, 4, 8, 16 on this 2-core
//   machine (8 and 16 oversubscribed: what punishes a lock that spins while
//   the holder is descheduled). See Contended.swift for how a window is run
//   and what the time and fairness columns mean. "lock.contended 4 threads
//   work 20 in 200 out" and "... work 5 in 20 out" add work inside and
//   outside the lock (rounds of spinWork, ~1.6 ns each). The reference is
//   glibc's adaptive mutex in every contended group (the best peer is not
//   known in advance: compare Spindle's row to the best of the others).

import Benchmark
import BenchSupport
import Foundation
import NIOConcurrencyHelpers
import Spindle
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

let benchmarks: @Sendable () -> Void = {
    // Uncontended pairs take 5–50 ns: 1,000 per iteration, 0.25 s per row
    // (the whole Locks suite must stay near two minutes).
    let uncontended = RunSettings(maxDuration: .milliseconds(250))

    // MARK: Lock

    do {
        let lock = Spindle.Lock()
        let mutex = SynchronizationMutex()
        let nslock = NSLock()
        let pthread = PthreadMutex()
        let adaptive = PthreadMutex.adaptive()
        let niolock = NIOLock()
        sideBySide(
            group: "lock.uncontended",
            settings: uncontended,
            spindle: { benchmark in
                benchmark.repeatOperation {
                    lock.lock()
                    lock.unlock()
                }
            },
            peers: [
                .reference("Synchronization.Mutex") { benchmark in
                    benchmark.repeatOperation { mutex.mutex.pointee.withLock { _ in } }
                },
                .peer("NSLock") { benchmark in
                    benchmark.repeatOperation {
                        nslock.lock()
                        nslock.unlock()
                    }
                },
                .peer("pthread.mutex") { benchmark in
                    benchmark.repeatOperation {
                        pthread_mutex_lock(pthread.mutex)
                        pthread_mutex_unlock(pthread.mutex)
                    }
                },
                .peer("pthread.mutex.adaptive") { benchmark in
                    benchmark.repeatOperation {
                        pthread_mutex_lock(adaptive.mutex)
                        pthread_mutex_unlock(adaptive.mutex)
                    }
                },
                .peer("NIOLock") { benchmark in
                    benchmark.repeatOperation {
                        niolock.lock()
                        niolock.unlock()
                    }
                },
            ]
        )
    }

    // MARK: LockedValue (a value behind a lock; LockedValues.swift)

    registerLockedValueBenchmarks(settings: uncontended)

    // MARK: RecursiveLock

    do {
        let lock = RecursiveLock()
        let nslock = NSRecursiveLock()
        let pthread = PthreadMutex.recursive()
        sideBySide(
            group: "recursivelock.uncontended",
            settings: uncontended,
            spindle: { benchmark in
                benchmark.repeatOperation {
                    lock.lock()
                    lock.unlock()
                }
            },
            peers: [
                .reference("NSRecursiveLock") { benchmark in
                    benchmark.repeatOperation {
                        nslock.lock()
                        nslock.unlock()
                    }
                },
                .peer("pthread.mutex.recursive") { benchmark in
                    benchmark.repeatOperation {
                        pthread_mutex_lock(pthread.mutex)
                        pthread_mutex_unlock(pthread.mutex)
                    }
                },
            ]
        )
    }

    // MARK: ReadWriteLock

    do {
        let lock = ReadWriteLock()
        let pthread = PthreadReadWriteLock()
        sideBySide(
            group: "rwlock.read uncontended",
            settings: uncontended,
            spindle: { benchmark in
                benchmark.repeatOperation {
                    lock.readLock()
                    lock.readUnlock()
                }
            },
            peers: [
                .reference("pthread.rwlock") { benchmark in
                    benchmark.repeatOperation {
                        pthread_rwlock_rdlock(pthread.rwlock)
                        pthread_rwlock_unlock(pthread.rwlock)
                    }
                },
            ]
        )
    }

    do {
        let lock = ReadWriteLock()
        let pthread = PthreadReadWriteLock()
        sideBySide(
            group: "rwlock.write uncontended",
            settings: uncontended,
            spindle: { benchmark in
                benchmark.repeatOperation {
                    lock.writeLock()
                    lock.writeUnlock()
                }
            },
            peers: [
                .reference("pthread.rwlock") { benchmark in
                    benchmark.repeatOperation {
                        pthread_rwlock_wrlock(pthread.rwlock)
                        pthread_rwlock_unlock(pthread.rwlock)
                    }
                },
            ]
        )
    }

    // MARK: SpinLock

    do {
        let lock = SpinLock()
        let pthread = PthreadSpinLock()
        sideBySide(
            group: "spinlock.uncontended",
            settings: uncontended,
            spindle: { benchmark in
                benchmark.repeatOperation {
                    lock.lock()
                    lock.unlock()
                }
            },
            peers: [
                .reference("pthread.spinlock") { benchmark in
                    benchmark.repeatOperation {
                        pthread_spin_lock(pthread.spinlock)
                        pthread_spin_unlock(pthread.spinlock)
                    }
                },
            ]
        )
    }

    // MARK: Once (the fast path: the body has run)

    do {
        // Each implementation initializes its value once, before measuring;
        // the measured operation is "make sure it is initialized, read it".
        let once = Once()
        let onceValue = allocateOnOwnCacheLine(0)
        once.run { onceValue.pointee = onceInitialValue() }
        let control = allocateOnOwnCacheLine(pthread_once_t())
        pthread_once(control) { pthreadOnceValue = onceInitialValue() }
        _ = lazyGlobalValue
        sideBySide(
            group: "lock.once done",
            settings: uncontended,
            spindle: { benchmark in
                benchmark.repeatOperation {
                    once.run { onceValue.pointee = onceInitialValue() }
                    return onceValue.pointee
                }
            },
            peers: [
                .reference("pthread.once") { benchmark in
                    benchmark.repeatOperation {
                        pthread_once(control) { pthreadOnceValue = onceInitialValue() }
                        return pthreadOnceValue
                    }
                },
                // The optimizer may hoist a lazy global's check out of the
                // loop (it knows the initializer runs once): then this row
                // is the loop alone, which is what such code costs.
                .peer("Swift.lazyGlobal") { benchmark in
                    benchmark.repeatOperation { lazyGlobalValue }
                },
            ]
        )
    }

    // MARK: synchronized (@synchronized) beside a lock per object

    do {
        final class Guarded: Sendable {
            let recursive = NSRecursiveLock()
            let plain = NSLock()
        }
        let object = Guarded()
        let value = allocateOnOwnCacheLine(0)
        sideBySide(
            group: "lock.synchronized uncontended",
            settings: uncontended,
            spindle: { benchmark in
                benchmark.repeatOperation {
                    synchronized(object) { value.pointee &+= 1 }
                }
            },
            peers: [
                // What objc-less code writes instead: a recursive lock per
                // object (recursive, like @synchronized)...
                .reference("NSRecursiveLock") { benchmark in
                    benchmark.repeatOperation {
                        object.recursive.lock()
                        value.pointee &+= 1
                        object.recursive.unlock()
                    }
                },
                // ...or a plain one, when it knows it never nests.
                .peer("NSLock") { benchmark in
                    benchmark.repeatOperation {
                        object.plain.lock()
                        value.pointee &+= 1
                        object.plain.unlock()
                    }
                },
            ]
        )
    }

    // MARK: Creation, and the heap a lock takes

    do {
        let creation = RunSettings(
            maxDuration: .milliseconds(200), warmupIterations: 5, reportedMetrics: [.mallocCount, .mallocBytes])
        sideBySide(
            group: "lock.create",
            settings: creation,
            spindle: creating { Spindle.Lock() },
            peers: [
                .reference("NSLock", body: creating { NSLock() }),
                .peer("NIOLock", body: creating { NIOLock() }),
                .peer("Synchronization.Mutex", body: creating { MutexOwner() }),
                .peer("pthread.mutex", body: creating(makePthreadMutex, destroy: destroyPthreadMutex)),
            ]
        )
        sideBySide(
            group: "recursivelock.create",
            settings: creation,
            spindle: creating { RecursiveLock() },
            peers: [
                .reference("NSRecursiveLock", body: creating { NSRecursiveLock() }),
            ]
        )
        sideBySide(
            group: "rwlock.create",
            settings: creation,
            spindle: creating { ReadWriteLock() },
            peers: [
                .reference("pthread.rwlock", body: creating(makePthreadReadWriteLock, destroy: destroyPthreadReadWriteLock)),
            ]
        )
    }

    // MARK: Contended throughput and fairness

    // The bare counter at each N; then mixes nearer real code at each N:
    // about 30 ns of work inside the lock and 300 ns outside (20 and 200
    // rounds of spinWork), where threads contend without queueing all the
    // time, and about 160 ns inside and 1.6 µs outside (100 and 1000), a
    // critical section that does real work; about 8 ns inside and 30 ns
    // outside (5 and 20 rounds) at 4 threads, where the lock is held a third
    // of the time or more and two running threads collide on most
    // operations; and a shared structure: a `[Int: Int]` of 1,024 entries
    // updated under the lock, with 200 rounds outside.
    let threadCounts = [2, 4, 8, 16]
    let workloads = threadCounts.map { ContendedWorkload(threads: $0) }
        + threadCounts.flatMap { threads in
            [
                ContendedWorkload(threads: threads, workInside: 20, workOutside: 200),
                ContendedWorkload(threads: threads, workInside: 100, workOutside: 1000),
            ]
        }
        + [ContendedWorkload(threads: 4, workInside: 5, workOutside: 20)]
        + [4, 16].map { ContendedWorkload(threads: $0, workOutside: 200, dictionaryKeys: 1024) }
    for workload in workloads {
        sideBySide(
            group: workload.group,
            settings: ContendedWorkload.settings,
            spindle: contendedBody(Spindle.Lock(), workload),
            peers: [
                .reference("pthread.mutex.adaptive", body: contendedBody(PthreadMutex.adaptive(), workload)),
                .peer("pthread.mutex", body: contendedBody(PthreadMutex(), workload)),
                .peer("NSLock", body: contendedBody(NSLock(), workload)),
                .peer("Synchronization.Mutex", body: contendedBody(SynchronizationMutex(), workload)),
                .peer("NIOLock", body: contendedBody(NIOLock(), workload)),
            ]
        )
    }
}

/// A creation benchmark: makes one lock per operation with `make`, keeps them
/// all until the measurement has stopped, then lets them go (`destroy` for
/// the ones that need it).
func creating<T>(_ make: @escaping () -> T, destroy: @escaping (T) -> Void = { _ in }) -> (Benchmark) -> Void {
    { benchmark in
        var made: [T] = []
        made.reserveCapacity(benchmark.scaledIterations.count)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations {
            made.append(make())
        }
        benchmark.stopMeasurement()
        made.forEach(destroy)
    }
}

func makePthreadMutex() -> UnsafeMutablePointer<pthread_mutex_t> {
    let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    precondition(pthread_mutex_init(mutex, nil) == 0, "pthread_mutex_init failed")
    return mutex
}

func destroyPthreadMutex(_ mutex: UnsafeMutablePointer<pthread_mutex_t>) {
    pthread_mutex_destroy(mutex)
    mutex.deallocate()
}

func makePthreadReadWriteLock() -> UnsafeMutablePointer<pthread_rwlock_t> {
    let rwlock = UnsafeMutablePointer<pthread_rwlock_t>.allocate(capacity: 1)
    precondition(pthread_rwlock_init(rwlock, nil) == 0, "pthread_rwlock_init failed")
    return rwlock
}

func destroyPthreadReadWriteLock(_ rwlock: UnsafeMutablePointer<pthread_rwlock_t>) {
    pthread_rwlock_destroy(rwlock)
    rwlock.deallocate()
}
