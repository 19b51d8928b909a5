import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

@Suite("Event registry")
struct EventRegistryTests {
    @Test func preferredBackendFollowsTheKernel() {
        if EventBackends.ioUringRefusal == nil {
            #expect([EventBackendKind.ioUring, .epoll].contains(EventBackends.preferredKind))
        } else {
            #expect(EventBackends.preferredKind == .epoll)
        }
    }

    /// Waking a loop that is awake costs no system call; waking a sleeping
    /// one costs exactly one.
    @Test(arguments: availableBackends)
    func wakeMakesASyscallOnlyWhenAsleep(kind: EventBackendKind) throws {
        let registry = try EventRegistry(kind: kind)
        var events: [ReadyEvent] = []
        // Awake (not in wait): wakes only mark the state.
        for _ in 0..<100 { registry.wake() }
        #expect(registry.statistics.wakeRequests == 100)
        #expect(registry.statistics.wakeSyscalls == 0)
        // The pending wake makes the next wait return at once.
        #expect(registry.wait(until: .distantFuture, events: &events))
        // Asleep: a wake from another thread costs one syscall.
        let box = Unchecked(registry)
        let join = startThread {
            usleep(30_000)
            box.value.wake()
        }
        #expect(registry.wait(until: .now.advanced(by: .seconds(30)), events: &events))
        join()
        #expect(registry.statistics.wakeSyscalls == 1)
    }

    @Test(arguments: availableBackends)
    func waitTimesOutNoEarlier(kind: EventBackendKind) throws {
        let registry = try EventRegistry(kind: kind)
        var events: [ReadyEvent] = []
        let start = MonotonicClock.now
        #expect(!registry.wait(until: start.advanced(by: .milliseconds(20)), events: &events))
        #expect(start.duration(to: .now) >= .milliseconds(20))
        #expect(events.isEmpty)
    }

    /// A registration is reported once per arming.
    @Test(arguments: availableBackends)
    func readinessIsOneShotUntilRearmed(kind: EventBackendKind) throws {
        let registry = try EventRegistry(kind: kind)
        try withPipe { readEnd, writeEnd in
            let token = try registry.register(readEnd, for: .readable)
            var b: UInt8 = 1
            _ = write(writeEnd, &b, 1)
            var events: [ReadyEvent] = []
            _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
            #expect(events.map(\.token) == [token])
            #expect(events.first?.readiness.contains(.readable) == true)
            events.removeAll()
            // Still readable, but not re-armed: not reported again.
            _ = registry.wait(until: .now.advanced(by: .milliseconds(20)), events: &events)
            #expect(events.isEmpty)
            registry.rearm(token)
            _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
            #expect(events.map(\.token) == [token])
            registry.deregister(token)
            registry.applyChanges()
            #expect(registry.counts == (0, 0))
        }
    }

    /// A registry that waits in the kernel while descriptors are registered
    /// (the event reactor's): with every watch consumed, a re-arm from
    /// another thread reaches the owner's epoll wait directly, with no wake
    /// (no wake request, no wake-word sleep to end). Without the setting the
    /// same re-arm must wake the owner, asleep on its wake word.
    @Test(arguments: [true, false])
    func reArmFromAnotherThreadReachesAKernelWaitWithoutAWake(waitsInKernel: Bool) throws {
        let registry = try EventRegistry(kind: .epoll)
        registry.waitsInKernelWhileRegistered = waitsInKernel
        try withPipe { readEnd, writeEnd in
            let token = try registry.register(readEnd, for: .readable)
            var b: UInt8 = 1
            _ = write(writeEnd, &b, 1)
            var events: [ReadyEvent] = []
            _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
            #expect(events.map(\.token) == [token])
            events.removeAll()
            // The watch is consumed and the pipe still holds the byte: the
            // owner's next wait has nothing armed until the other thread
            // re-arms.
            let box = Unchecked(registry)
            let neededWake = LockedValue<Bool?>(nil)
            let join = startThread {
                usleep(30_000)
                let mustWake = box.value.rearmNow(token)
                neededWake.withLock { $0 = mustWake }
                if mustWake { box.value.wake() }
            }
            let woken = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
            join()
            // Reached by the re-arm itself, or woken first (a wake-word
            // sleep returns without polling): then the next wait reports.
            #expect(woken == !waitsInKernel)
            if events.isEmpty {
                _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
            }
            #expect(events.map(\.token) == [token])
            #expect(neededWake.withLock { $0 } == !waitsInKernel)
            #expect(registry.statistics.wakeRequests == (waitsInKernel ? 0 : 1))
            registry.deregister(token)
            registry.applyChanges()
        }
    }

    /// Two registrations on one descriptor (a socket's reader and writer):
    /// each is reported for its own interest, and ending one leaves the
    /// other working.
    @Test(arguments: availableBackends)
    func twoInterestsInOneDescriptor(kind: EventBackendKind) throws {
        let registry = try EventRegistry(kind: kind)
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        let reader = try registry.register(pair[0], for: .readable)
        let writer = try registry.register(pair[0], for: .writable)
        var events: [ReadyEvent] = []
        // Writable at once; not readable yet: only the writer is reported,
        // and the reader stays armed.
        _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.map(\.token) == [writer])
        #expect(registry.isArmed(reader))
        events.removeAll()
        var b: UInt8 = 7
        _ = write(pair[1], &b, 1)
        _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.map(\.token) == [reader])
        events.removeAll()
        // Ending the reader leaves the writer armed and reported.
        registry.deregister(reader)
        registry.rearm(writer)
        _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.map(\.token) == [writer])
        registry.deregister(writer)
    }

    /// A descriptor that cannot be waited on is refused at registration, the
    /// same way on both backends: epoll refuses a regular file (EPERM) while
    /// io_uring would report it ready without end.
    @Test(arguments: availableBackends)
    func unwatchableDescriptorsAreRefusedAtRegistration(kind: EventBackendKind) throws {
        let registry = try EventRegistry(kind: kind)
        let file = open("/proc/self/exe", O_RDONLY | O_CLOEXEC)
        #expect(file >= 0)
        defer { close(file) }
        #expect(throws: DescriptorWatchError(descriptor: file, reason: .alwaysReady, code: EPERM)) {
            try registry.register(file, for: .readable)
        }
        let directory = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        defer { close(directory) }
        #expect(throws: DescriptorWatchError(descriptor: directory, reason: .alwaysReady, code: EPERM)) {
            try registry.register(directory, for: .readable)
        }
        let closed = closedDescriptorNumber()
        #expect(throws: DescriptorWatchError(descriptor: closed, reason: .notOpen, code: EBADF)) {
            try registry.register(closed, for: .readable)
        }
        #expect(registry.counts == (0, 0))
    }

    /// A descriptor closed while registered is reported failed (EBADF) when
    /// it is next watched, on both backends, and its registration disarmed.
    @Test(arguments: availableBackends)
    func descriptorClosedWhileRegisteredFailsWhenRearmed(kind: EventBackendKind) throws {
        let registry = try EventRegistry(kind: kind)
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[1]) }
        // A number no test running beside this one gets when it closes.
        let readEnd = movedOutOfTheWay(fds[0])
        let token = try registry.register(readEnd, for: .readable)
        var b: UInt8 = 1
        _ = write(fds[1], &b, 1)
        var events: [ReadyEvent] = []
        _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.map(\.token) == [token])
        close(readEnd)
        registry.rearm(token)
        events.removeAll()
        _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.count == 1)
        #expect(events.first?.token == token)
        #expect(events.first?.failure?.reason == .notOpen)
        #expect(!registry.isArmed(token))
        registry.deregister(token)
    }

    /// A descriptor number closed and reused at once, with the old
    /// registration's watch still in the kernel (disabled after its report,
    /// or, with `oldStillArmed`, pending on the old file): the new
    /// registration gets a watch of its own, works, and nothing of the old
    /// one is reported.
    @Test(arguments: availableBackends, [false, true])
    func reusedDescriptorNumberStartsClean(kind: EventBackendKind, oldStillArmed: Bool) throws {
        let registry = try EventRegistry(kind: kind)
        // A number no other test uses (see `makePipe(readEndAt:)`).
        let number: Int32 = 910 + (kind == .epoll ? 1 : 0) + (oldStillArmed ? 2 : 0)
        let (oldRead, oldWrite) = makePipe(readEndAt: number)
        let old = try registry.register(oldRead, for: .readable)
        var events: [ReadyEvent] = []
        if oldStillArmed {
            registry.applyChanges()  // its watch is in the kernel, pending
        } else {
            poke(oldWrite)
            _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
            #expect(events.map(\.token) == [old])
        }
        registry.deregister(old)
        close(oldRead)
        close(oldWrite)
        let (newRead, newWrite) = makePipe(readEndAt: number)
        defer { close(newRead); close(newWrite) }
        let new = try registry.register(newRead, for: .readable)
        poke(newWrite)
        events.removeAll()
        _ = registry.wait(until: .now.advanced(by: .seconds(10)), events: &events)
        #expect(events.map(\.token) == [new])
        #expect(events.first?.failure == nil)
        registry.deregister(new)
    }

    /// An untimed wait that a signal interrupts goes on waiting (io_uring
    /// used to stop the process with a stale errno: liburing 2.3 returns the
    /// error without setting errno).
    @Test(arguments: availableBackends)
    func signalDuringUntimedWaitIsAbsorbed(kind: EventBackendKind) throws {
        installQuietSignalHandler()
        let registry = try EventRegistry(kind: kind)
        try withPipe { readEnd, writeEnd in
            let token = try registry.register(readEnd, for: .readable)
            let waiter = pthread_self()
            let writer = Unchecked(writeEnd)
            let join = startThread {
                for _ in 0..<5 {
                    usleep(10_000)
                    _ = cshims_thread_kill(waiter, SIGUSR1)
                }
                usleep(10_000)
                var b: UInt8 = 1
                _ = write(writer.value, &b, 1)
            }
            var events: [ReadyEvent] = []
            while events.isEmpty {
                _ = registry.wait(until: nil, events: &events)
            }
            join()
            #expect(events.map(\.token) == [token])
        }
    }

    /// An idle loop sleeps: over a second it makes a handful of waits, not a
    /// spin's worth, and uses almost no CPU.
    @Test(arguments: availableBackends)
    func idleLoopUsesNoCPU(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let keep = LoopSource { _ in }
            loop.add(keep)
            var before = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &before)
            loop.run(mode: .default, timeout: .seconds(1))
            var after = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &after)
            let cpuMicros = (after.tv_sec - before.tv_sec) * 1_000_000 + (after.tv_nsec - before.tv_nsec) / 1_000
            #expect(cpuMicros < 30_000, "an idle loop burned \(cpuMicros) µs of CPU in 1 s")
            #expect(loop.eventStatistics.waitSyscalls < 10)
            keep.invalidate()
        }
    }

    /// A loop that watches no descriptor sleeps for its timers on the wake
    /// word, and a sleep that reaches its deadline there ends the wait: no
    /// kernel poll follows it, as there is nothing in the kernel to report.
    /// One wait per firing (the old wait made two: the sleep, then an
    /// `epoll_wait` or an io_uring enter that could only come back empty).
    @Test(arguments: availableBackends)
    func aTimerFiringOnAnIdleLoopCostsOneWait(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let keep = LoopSource { _ in }
            loop.add(keep)
            let fired = LockedValue(0)
            let timer = LoopTimer(fireAt: MonotonicClock.now.advanced(by: .milliseconds(2)), interval: .milliseconds(2)) { _ in
                fired.withLock { $0 += 1 }
            }
            loop.add(timer, forMode: .default)
            let before = loop.eventStatistics.waitSyscalls
            loop.run(mode: .default, timeout: .milliseconds(200))
            let waits = loop.eventStatistics.waitSyscalls - before
            let firings = fired.withLock { $0 }
            timer.invalidate()
            keep.invalidate()
            #expect(firings > 0)
            // A few more than the firings: the run's last sleep ends at its
            // timeout, not at a firing.
            #expect(waits <= UInt64(firings) + 3, "\(waits) waits for \(firings) timer firings")
        }
    }
}

/// A SIGUSR1 handler that does nothing, so a signal interrupts a system
/// call without ending the process.
func installQuietSignalHandler() {
    var action = sigaction()
    action.__sigaction_handler.sa_handler = { _ in }
    sigemptyset(&action.sa_mask)
    action.sa_flags = 0  // no SA_RESTART: the wait returns EINTR
    sigaction(SIGUSR1, &action, nil)
}

@Suite("ThreadLoop memory")
struct ThreadLoopMemoryTests {
    /// Sources and timers added and removed over and over leave nothing
    /// behind: resident memory stays flat (within 4 MiB) across 200,000
    /// add/remove rounds after a warm-up. In a child process, so that no
    /// other test's allocations move the process's resident size.
    @Test func addRemoveDoesNotGrowMemory() async {
        await #expect(processExitsWith: .success) {
            for kind in availableBackends {
                let failed = UnsafeMutablePointer<Int>.allocate(capacity: 1)
                failed.initialize(to: 0)
                let box = SharedPointer(failed)
                onLoopThread(kind) { loop in
                    func rounds(_ n: Int) {
                        for i in 0..<n {
                            let source = LoopSource { _ in }
                            loop.add(source, forMode: i % 3 == 0 ? .common : .default)
                            let timer = LoopTimer(after: .seconds(60)) { _ in }
                            loop.add(timer, forMode: .default)
                            loop.remove(source, forMode: i % 3 == 0 ? .common : .default)
                            timer.invalidate()
                            if i % 1_000 == 0 { loop.run(mode: .default, timeout: .zero) }
                        }
                    }
                    rounds(20_000)
                    let before = residentBytes()
                    rounds(200_000)
                    let growth = residentBytes() - before
                    if growth >= 4 << 20 {
                        print("\(kind): resident memory grew \(growth) bytes over 200,000 add/remove rounds")
                        box.pointer.pointee = 1
                    }
                }
                if failed.pointee != 0 { exit(1) }
            }
            exit(0)
        }
    }
}
