import Spindle
import Testing
import TestSupport

private struct Refusal: Error, Equatable {
    let index: Int
}

@Suite("NativeThread stress")
struct NativeThreadStressTests {
    /// Several threads start and join threads at once; every result and every
    /// thrown error reaches its joiner, and `current`, the thread dictionary
    /// and `id` are consistent on every thread. A watcher reads the threads'
    /// state from outside meanwhile.
    @Test(arguments: [2, 4])
    func concurrentCreatorsGetEveryResultAndError(creators: Int) {
        let perCreator = stressSize(ci: 120, full: 2_400)
        let batch = 6
        let mismatches = AtomicCounters(1)
        runThreads(creators) { creator in
            var index = 0
            while index < perCreator {
                let threads = (index..<min(index + batch, perCreator)).map { i in
                    try! NativeThread.start(NativeThread.Attributes(name: "c\(creator)-\(i)")) { () throws -> Int in
                        let me = NativeThread.current
                        me.threadDictionary["index"] = i
                        if i % 5 == 0 { throw Refusal(index: i) }
                        let stored = me.threadDictionary.value(forKey: "index", as: Int.self)
                        return stored == i && me.id > 0 ? creator * 1000 + i : -1
                    }
                }
                for thread in threads {
                    _ = thread.isFinished
                    _ = thread.id
                    thread.cancel()
                }
                for (offset, thread) in threads.enumerated() {
                    let i = index + offset
                    do {
                        let value = try thread.join()
                        if i % 5 == 0 || value != creator * 1000 + i { mismatches.add(0) }
                    } catch let error as Refusal {
                        if error.index != i || i % 5 != 0 { mismatches.add(0) }
                    } catch {
                        mismatches.add(0)
                    }
                    if !thread.isFinished || !thread.isCancelled { mismatches.add(0) }
                }
                index += batch
            }
        }
        #expect(mismatches[0] == 0)
        // Each thread's result or error, and its state, checked by its joiner.
        StressReport.record(operations: creators * perCreator, threads: creators, checks: 2 * creators * perCreator)
    }

    /// Joinable, detached and foreign threads each store three thread-local
    /// values; every value's destructor runs exactly once, on its thread.
    @Test func threadLocalDestructorsRunExactlyOncePerThread() {
        let joinable = stressSize(ci: 48, full: 480)
        let detached = stressSize(ci: 48, full: 480)
        let foreign = stressSize(ci: 16, full: 160)
        let total = joinable + detached + foreign
        let destroyed = AtomicCounters(total)
        let wrongThread = AtomicCounters(1)
        let detachedDone = Latch(detached)
        // Created first, so its destructor runs last (reverse order of
        // creation): once it has run, the thread's other destructors have.
        let marker = ThreadLocal<Int>(onThreadExit: { _ in detachedDone.countDown() })
        let locals = (0..<3).map { _ in
            ThreadLocal<(index: Int, tid: Int32)>(onThreadExit: { value in
                if NativeThread.current.id != value.tid { wrongThread.add(0) }
                destroyed.add(value.index)
            })
        }
        @Sendable func fill(_ index: Int) {
            for local in locals { local.value = (index, NativeThread.current.id) }
        }

        runThreads(2) { half in
            let range = half == 0 ? 0..<joinable / 2 : joinable / 2..<joinable
            let threads = range.map { i in try! NativeThread.start { fill(i) } }
            for thread in threads { try! thread.join() }
        }
        for i in joinable..<(joinable + detached) {
            try! NativeThread.detach {
                fill(i)
                marker.value = i
            }
        }
        runThreads(foreign) { i in fill(joinable + detached + i) }

        #expect(detachedDone.wait(), "every detached thread exited")
        let wrong = (0..<total).filter { destroyed[$0] != 3 }
        #expect(wrong.isEmpty, "threads whose destructors did not run exactly three times: \(wrong)")
        #expect(wrongThread[0] == 0, "a destructor ran on another thread")
        // Each thread's three destructor runs checked, and where they ran.
        StressReport.record(operations: 3 * total, threads: total, checks: total + 2)
    }

    /// Threads that alternate short and very long sleeps are cancelled in a
    /// scrambled order by several cancellers; every one of them stops.
    @Test func cancellationReachesEverySleeper() throws {
        let count = stressSize(ci: 16, full: 160)
        let iterations = AtomicCounters(count)
        let threads = try (0..<count).map { i in
            try NativeThread.start { () -> Bool in
                var round = 0
                while !NativeThread.current.isCancelled {
                    iterations.add(i)
                    // Mostly short sleeps, sometimes one that only cancel() ends.
                    NativeThread.sleep(for: round % 7 == 3 ? .seconds(600) : .microseconds(50 + (i * 37 + round * 11) % 400))
                    round += 1
                }
                return NativeThread.current.isCancelled
            }
        }
        let order = (0..<count).map { ($0 * 7 + 3) % count }
        let shared = UnsafeBox(threads)
        runThreads(4) { canceller in
            for (position, index) in order.enumerated() where position % 4 == canceller {
                shared.value[index].cancel()
                shared.value[index].cancel()
            }
        }
        // A thread may be cancelled before its first round; every one must
        // have seen the request when it returned.
        for thread in threads { #expect(try thread.join()) }
        StressReport.record(operations: (0..<count).reduce(0) { $0 + iterations[$1] }, threads: count + 4, checks: count)
    }

    /// cancel() racing with the thread entering its sleep: the wake-up is
    /// never lost (a lost one would leave the thread asleep for ten minutes).
    @Test func cancelRacingSleepIsNeverLost() throws {
        let rounds = stressSize(ci: 300, full: 6_000)
        for round in 0..<rounds {
            let thread = try NativeThread.start { NativeThread.sleep(for: .seconds(600)) }
            if round % 3 == 1 { NativeThread.yield() }
            thread.cancel()
            #expect(try thread.join() == false)
        }
        StressReport.record(operations: rounds, threads: 2, checks: rounds)
    }

    /// Joinable threads whose `SpawnedThread` is released without a join,
    /// some before the body ends and some after: each is detached by the
    /// last release, on whichever thread that happens.
    @Test func releasedWithoutJoinDetachesOnEitherSide() {
        // 10×, not 20×, at full size: half of them are alive at once.
        let count = stressSize(ci: 200, full: 2_000)
        let ran = Latch(count)
        let release = Latch()
        var kept: [SpawnedThread<Int>] = []
        for i in 0..<count {
            let thread = try! NativeThread.start { () -> Int in
                if i % 2 == 0 { release.wait() }
                ran.countDown()
                return i
            }
            if i % 4 == 1 { kept.append(thread) }
        }
        release.countDown()
        #expect(ran.wait())
        kept.removeAll()
        StressReport.record(operations: count, threads: count, checks: 1)
    }
}
