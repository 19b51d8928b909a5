import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The run loop driven the way ordinary programs drive it: descriptors that
/// close and get reused, sockets with a reader and a writer, signals, fork.
@Suite("ThreadLoop: real descriptors, signals and fork", .serialized)
struct ThreadLoopRealUseTests {
    /// The documented order (the handler invalidates its source, then closes
    /// its descriptor), then a new source on the same descriptor number: it
    /// works. epoll used to stop the process with `epoll_ctl: ENOENT`.
    @Test(arguments: availableBackends)
    func reusedDescriptorAfterHandlerClosedIt(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let (readEnd, writeEnd) = makePipe(readEndAt: 900)
            let log = EventLog()
            let first = LoopSource(descriptor: readEnd) { source, _ in
                log.append("first")
                source.invalidate()
                close(readEnd)
            }
            loop.add(first)
            poke(writeEnd)
            #expect(loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource)
            close(writeEnd)
            let (again, againWrite) = makePipe(readEndAt: 900)
            defer { close(again); close(againWrite) }
            let second = LoopSource(descriptor: again) { _, _ in
                drain(again)
                log.append("second")
            }
            loop.add(second)
            poke(againWrite)
            #expect(loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource)
            #expect(log.all == ["first", "second"])
            #expect(second.failure == nil && second.isValid)
            second.invalidate()
        }
    }

    /// A source whose event is held for another mode is invalidated from
    /// another thread, its descriptor closed and the number reused by a new
    /// source, all while the loop sleeps: the new source works.
    @Test(arguments: availableBackends)
    func reusedDescriptorWhileAnEventIsHeldForAnotherMode(kind: EventBackendKind) {
        let log = EventLog()
        let running = RunningLoop(kind) { loop in
            loop.run(mode: .default, until: .distantFuture)
        }
        let loop = running.loop!
        let (readEnd, writeEnd) = makePipe(readEndAt: 901)
        let held = LoopSource(descriptor: readEnd) { _, _ in log.append("held") }
        loop.add(held, forMode: "other")
        poke(writeEnd)
        // Let the loop take the event (it holds it for "other").
        usleep(50_000)
        held.invalidate()
        close(readEnd)
        close(writeEnd)
        let (again, againWrite) = makePipe(readEndAt: 901)
        defer { close(again); close(againWrite) }
        let fired = Latch()
        let fresh = LoopSource(descriptor: again) { source, _ in
            drain(again)
            log.append("fresh")
            source.invalidate()
            fired.countDown()
        }
        loop.add(fresh)
        poke(againWrite)
        #expect(fired.wait())
        loop.stop()
        _ = running.join()
        #expect(log.all == ["fresh"])
        #expect(fresh.failure == nil)
    }

    /// Two sources on one socket in one loop, a reader and a writer: each
    /// fires for its own readiness, and removing one leaves the other
    /// working (armed state used to be keyed by descriptor).
    @Test(arguments: availableBackends)
    func readerAndWriterOnOneSocket(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            var pair: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
            defer { close(pair[0]); close(pair[1]) }
            let socket = pair[0]
            let log = EventLog()
            let writer = LoopSource(descriptor: socket, interest: .writable) { source, readiness in
                log.append(readiness.contains(.writable) ? "writable" : "writer?")
                source.invalidate()
            }
            let reader = LoopSource(descriptor: socket, interest: .readable) { _, readiness in
                drain(socket)
                log.append(readiness.contains(.readable) ? "readable" : "reader?")
            }
            loop.add(reader)
            loop.add(writer)
            // Writable at once; the writer removes itself.
            #expect(loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource)
            #expect(log.all == ["writable"])
            // The reader still works after the writer left.
            poke(pair[1])
            #expect(loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource)
            poke(pair[1])
            #expect(loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource)
            #expect(log.all == ["writable", "readable", "readable"])
            reader.invalidate()
        }
    }

    /// Descriptors that cannot be watched fail the source where the caller
    /// can see it, the same on both backends, and the process goes on: a
    /// regular file and a closed descriptor at `add`; a descriptor closed
    /// under its source when the loop watches it again.
    @Test(arguments: availableBackends)
    func unwatchableDescriptorsFailTheSource(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let file = open("/proc/self/exe", O_RDONLY | O_CLOEXEC)
            defer { close(file) }
            let fileSource = LoopSource(descriptor: file, failed: { _, error in log.append("\(error.reason)") }) { _, _ in
                log.append("fired")
            }
            loop.add(fileSource)
            #expect(fileSource.failure?.reason == .alwaysReady)
            #expect(!fileSource.isValid)
            #expect(!loop.contains(fileSource, inMode: .default))
            #expect(fileSource.failure.map { "\($0)" }?.contains("descriptor \(file)") == true)

            let closed = closedDescriptorNumber()
            let closedSource = LoopSource(descriptor: closed) { _, _ in log.append("fired") }
            loop.add(closedSource)
            #expect(closedSource.failure?.reason == .notOpen)

            // Closed under a working source (without invalidating it first).
            var fds: [Int32] = [0, 0]
            #expect(pipe(&fds) == 0)
            defer { close(fds[1]) }
            // A number no test running beside this one gets when it closes.
            let readEnd = movedOutOfTheWay(fds[0])
            let victim = LoopSource(descriptor: readEnd, failed: { _, error in log.append("victim \(error.reason)") }) { _, _ in
                log.append("victim fired")
                close(readEnd)
            }
            loop.add(victim)
            poke(fds[1])
            _ = loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true)
            // Re-watched after the handler: the closed descriptor fails it.
            _ = loop.run(mode: .default, timeout: .milliseconds(200))
            #expect(log.all == ["alwaysReady", "victim fired", "victim notOpen"])
            #expect(victim.failure?.reason == .notOpen && !victim.isValid)
        }
    }

    /// A signal delivered to a loop thread sleeping with an armed descriptor
    /// and no timer: the loop goes on (io_uring used to stop the process
    /// with a stale errno).
    @Test(arguments: availableBackends)
    func signalDuringAnUntimedSleep(kind: EventBackendKind) {
        installQuietSignalHandler()
        onLoopThread(kind) { loop in
            withPipe { readEnd, writeEnd in
                let source = LoopSource(descriptor: readEnd) { _, _ in drain(readEnd) }
                loop.add(source)
                let me = pthread_self()
                let writer = Unchecked(writeEnd)
                let join = startThread {
                    for _ in 0..<5 {
                        usleep(10_000)
                        _ = cshims_thread_kill(me, SIGUSR1)
                    }
                    poke(writer.value)
                }
                #expect(loop.run(mode: .default, until: .distantFuture, returnAfterSourceHandled: true) == .handledSource)
                join()
                source.invalidate()
            }
        }
    }

    /// A repeating timer whose interval is past what the clock can count
    /// fires once, then never again (the next date used to wrap into the
    /// past, so it fired on every pass).
    @Test(arguments: availableBackends)
    func hugeIntervalsSaturate(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let timers = [Duration.seconds(1 << 40), Duration(secondsComponent: .max, attosecondsComponent: 0), .seconds(Int64.max / 2)].map { interval in
                LoopTimer(after: .zero, interval: interval) { _ in log.append("fired") }
            }
            for t in timers { loop.add(t) }
            _ = loop.run(mode: .default, timeout: .milliseconds(50))
            #expect(log.all.count == 3)
            for t in timers {
                #expect(t.isValid)
                #expect(t.fireDate > MonotonicClock.now.advanced(by: .seconds(1_000 * 86_400)))
                t.invalidate()
            }
        }
    }

    /// A perform queued while the loop sleeps is an input source: the loop
    /// wakes, goes back to step 2 and runs it in step 4, after the
    /// before-timers and before-sources notifications, like a signalled
    /// custom source.
    @Test(arguments: availableBackends)
    func performQueuedDuringSleepRunsInStep4(kind: EventBackendKind) {
        let log = EventLog()
        let running = RunningLoop(kind) { loop in
            let observer = LoopObserver(activities: .all) { _, activity in log.append("\(activity)") }
            loop.add(observer)
            defer { observer.invalidate() }
            return loop.run(mode: .default, timeout: .seconds(30), returnAfterSourceHandled: true)
        }
        usleep(30_000)
        running.loop.perform { log.append("perform") }
        #expect(running.join() == .handledSource)
        #expect(log.all == [
            "entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting",
            "beforeTimers", "beforeSources", "perform", "exit",
        ])
    }

    /// The guide's polling pass: every run form makes at least one pass,
    /// even with a deadline already past, and runs a queued perform and a
    /// due timer once.
    @Test(arguments: availableBackends)
    func everyRunFormMakesOnePassWithAPastDeadline(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let forms: [(String, () -> Void)] = [
                ("run(until:)", { loop.run(until: .now) }),
                ("run(mode:until:)", { _ = loop.run(mode: .default, until: MonotonicClock.now.advanced(by: .zero - .seconds(1))) }),
                ("run(mode:timeout:)", { _ = loop.run(mode: .default, timeout: .zero) }),
            ]
            for (name, run) in forms {
                log.clear()
                let timer = LoopTimer(after: .zero) { _ in log.append("timer") }
                loop.add(timer)
                loop.perform { log.append("perform") }
                run()
                #expect(log.all.sorted() == ["perform", "timer"], "\(name)")
            }
        }
    }

    /// After `fork()` from a loop thread, the child starts afresh: its own
    /// loop (not the parent's ring or epoll set), its own thread record (the
    /// child's main thread), both working; and the parent's loop keeps
    /// working after the child exits. In a child process, so the test
    /// runner's threads are not forked.
    @Test func forkGivesTheChildFreshLoopAndThreadState() async {
        await #expect(processExitsWith: .success) {
          for kind in availableBackends {
            let ok = UnsafeMutablePointer<Bool>.allocate(capacity: 1)
            ok.initialize(to: false)
            let result = SharedPointer(ok)
            onLoopThread(kind) { loop in
                withPipe { readEnd, writeEnd in
                    let fired = UnsafeBox(0)
                    let source = LoopSource(descriptor: readEnd) { _, _ in
                        drain(readEnd)
                        fired.value += 1
                    }
                    loop.add(source)
                    poke(writeEnd)
                    guard loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource
                    else { return }
                    let parentThreadID = NativeThread.current.id
                    let pid = cshims_fork()
                    if pid == 0 {
                        // The child: fresh state everywhere.
                        let mine = ThreadLoop.current
                        guard mine !== loop, mine.ownerThreadID == getpid(),
                            NativeThread.current.id == getpid(), NativeThread.current.id != parentThreadID,
                            NativeThread.isMainThread, ThreadLoop.main === mine
                        else { _exit(2) }
                        // Its loop works, with a perform and a descriptor of its own.
                        let ran = LockedValue(false)
                        mine.perform { ran.withLock { $0 = true } }
                        let keep = LoopSource { _ in }
                        mine.add(keep)
                        _ = mine.run(mode: .default, timeout: .zero)
                        guard ran.withLock({ $0 }) else { _exit(3) }
                        var fds: [Int32] = [0, 0]
                        _ = pipe(&fds)
                        let own = LoopSource(descriptor: fds[0]) { _, _ in }
                        mine.add(own)
                        poke(fds[1])
                        guard mine.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource
                        else { _exit(4) }
                        _exit(0)
                    }
                    guard pid > 0 else { return }
                    var status: Int32 = 0
                    guard waitpid(pid, &status, 0) == pid, status == 0 else {
                        print("the forked child failed: status \(status)")
                        return
                    }
                    // The parent's loop and its descriptor source still work.
                    poke(writeEnd)
                    guard loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource,
                        fired.value == 2
                    else { return }
                    source.invalidate()
                    result.pointer.pointee = true
                }
            }
            if !ok.pointee {
                print("\(kind): fork test failed")
                exit(1)
            }
          }
          exit(0)
        }
    }
}
