// Creating a thread, Spindle's NativeThread beside raw pthread_create (the
// reference: what NativeThread is built on, with nothing added) and
// Foundation's Thread (what a Swift user on Linux would pick instead).
//
// Two groups, one thread per measured iteration (scalingFactor .one):
// - "thread.start to entry": from the call that starts the thread until its
//   entry routine runs (the Threading Programming Guide's creation time,
//   Table 2-1). The starter spins, yielding, on a flag the entry routine
//   sets; joining happens after the measurement stops.
// - "thread.create and join": start a thread with an empty body and wait
//   until it is gone. Foundation's Thread cannot be joined, so its row waits
//   for the block to finish instead (the thread itself may still be exiting:
//   that row does less work than the others).
//
// p99 is in package-benchmark's own output and in the JMH export
// (Bench/.build/bench-export); Bench/Sources/ThreadCosts prints median and
// p99 from timestamps taken inside the entry routine, and what a parked
// thread costs in memory.

import Benchmark
import BenchSupport
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

let benchmarks: @Sendable () -> Void = {
    let settings = RunSettings(
        scalingFactor: .one,
        maxDuration: .seconds(3),
        maxIterations: 1_000,
        warmupIterations: 20
    )

    // MARK: Start to entry

    do {
        let flag = allocateOnOwnCacheLine(UInt32(0))
        let shared = SharedWord(flag)
        sideBySide(
            group: "thread.start to entry",
            settings: settings,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations {
                    AtomicMemory.store(0, to: flag, ordering: .relaxed)
                    benchmark.startMeasurement()
                    let thread = try! NativeThread.start { shared.set() }
                    shared.await()
                    benchmark.stopMeasurement()
                    try! thread.join()
                }
            },
            peers: [
                .reference("pthread") { benchmark in
                    for _ in benchmark.scaledIterations {
                        AtomicMemory.store(0, to: flag, ordering: .relaxed)
                        benchmark.startMeasurement()
                        var thread = pthread_t()
                        let rc = pthread_create(&thread, nil, setFlagEntry, UnsafeMutableRawPointer(flag))
                        precondition(rc == 0, "pthread_create: \(rc)")
                        shared.await()
                        benchmark.stopMeasurement()
                        pthread_join(thread, nil)
                    }
                },
                .peer("Foundation.Thread") { benchmark in
                    for _ in benchmark.scaledIterations {
                        AtomicMemory.store(0, to: flag, ordering: .relaxed)
                        let done = allocateFlag()
                        benchmark.startMeasurement()
                        Foundation.Thread {
                            shared.set()
                            done.set()
                        }.start()
                        shared.await()
                        benchmark.stopMeasurement()
                        done.await()
                    }
                },
            ]
        )
    }

    // MARK: Create and join

    do {
        sideBySide(
            group: "thread.create and join",
            settings: settings,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations {
                    let thread = try! NativeThread.start {}
                    try! thread.join()
                }
            },
            peers: [
                .reference("pthread") { benchmark in
                    for _ in benchmark.scaledIterations {
                        var thread = pthread_t()
                        let rc = pthread_create(&thread, nil, emptyEntry, nil)
                        precondition(rc == 0, "pthread_create: \(rc)")
                        pthread_join(thread, nil)
                    }
                },
                .peer("Foundation.Thread until block ends") { benchmark in
                    for _ in benchmark.scaledIterations {
                        let done = allocateFlag()
                        Foundation.Thread { done.set() }.start()
                        done.await()
                    }
                },
            ]
        )
    }
}

/// A flag word that one thread sets and another waits for.
struct SharedWord: @unchecked Sendable {
    // @unchecked: the word is only accessed through AtomicMemory.
    let word: UnsafeMutablePointer<UInt32>
    init(_ word: UnsafeMutablePointer<UInt32>) { self.word = word }

    /// Sets the flag (a release: pairs with `await`).
    func set() { AtomicMemory.store(1, to: word, ordering: .releasing) }

    /// Spins until the flag is set, yielding the CPU every 64 checks so that
    /// a new thread placed on this CPU still gets to run.
    func await() {
        var spins = 0
        while AtomicMemory.load(from: word, ordering: .acquiring) == 0 {
            spins &+= 1
            if spins & 63 == 0 { sched_yield() } else { spinLoopHint() }
        }
    }
}

/// A fresh flag on its own line, for the Foundation rows, whose threads may
/// still be exiting when the next iteration begins. (Never freed, like all
/// benchmark state; a few kilobytes over a run.)
func allocateFlag() -> SharedWord {
    SharedWord(allocateOnOwnCacheLine(UInt32(0)))
}

/// pthread entry routines: the flag's address is the argument.
func setFlagEntry(_ argument: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    SharedWord(argument!.assumingMemoryBound(to: UInt32.self)).set()
    return nil
}

func emptyEntry(_ argument: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    nil
}
