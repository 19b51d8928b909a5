// A polling thread's `tryLock` against threads that hammer the same lock:
// how often the try wins. A try form that can never win while others
// contend is a starvation bug (issue 38); `pthread_mutex_trylock` wins in
// about a quarter of its tries in this shape.
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Runs `hammerers` threads that call `hammer()` in a loop (it should lock,
/// do a little, and unlock, with nothing outside the lock, so that the lock
/// is contended throughout) while one more thread calls `tryOnce()` `tries`
/// times, sleeping `spacingMicroseconds` after each. `tryOnce` unlocks what
/// it took and returns whether it took it. The hammerers start before the
/// first try and stop after the last. Returns the number of tries that won
/// and the number of hammer calls made meanwhile. A count, not a time: the
/// spacing only lets the hammerers run between tries.
public func countTriesWonWhileHammered(
    hammerers: Int, tries: Int, spacingMicroseconds: UInt32,
    hammer: @escaping @Sendable () -> Void, tryOnce: @escaping @Sendable () -> Bool
) -> (won: Int, hammered: Int) {
    let started = Atomic<Int>(0)
    let stop = Atomic<Bool>(false)
    let hammered = Atomic<Int>(0)
    let won = Atomic<Int>(0)
    runThreads(hammerers + 1) { index in
        if index < hammerers {
            started.add(1, ordering: .relaxed)
            var calls = 0
            while !stop.load(ordering: .relaxed) {
                hammer()
                calls += 1
            }
            hammered.add(calls, ordering: .relaxed)
            return
        }
        // Tries begin once every hammerer runs, so that the lock is
        // contended from the first try on.
        while started.load(ordering: .relaxed) < hammerers { usleep(100) }
        var wins = 0
        for _ in 0..<tries {
            if tryOnce() { wins += 1 }
            usleep(spacingMicroseconds)
        }
        won.store(wins, ordering: .relaxed)
        stop.store(true, ordering: .relaxed)
    }
    return (won.load(ordering: .relaxed), hammered.load(ordering: .relaxed))
}
