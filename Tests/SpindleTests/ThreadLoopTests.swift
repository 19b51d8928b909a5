import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Records every observer activity, source and timer firing of a loop.
private func observeAll(_ loop: ThreadLoop, _ log: EventLog, mode: LoopMode = .default) -> LoopObserver {
    let observer = LoopObserver(activities: .all) { _, activity in log.append("\(activity)") }
    loop.add(observer, forMode: mode)
    return observer
}

@Suite("ThreadLoop: the sequence of events")
struct ThreadLoopSequenceTests {
    @Test(arguments: availableBackends)
    func emptyModeFinishesAtOnceWithoutNotifications(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            _ = observeAll(loop, log)
            #expect(loop.run(mode: .default, timeout: .seconds(5)) == .finished)
            #expect(log.all.isEmpty)
        }
    }

    /// A signalled custom source, a zero-timeout run: no sleep, so no
    /// before/after-waiting notifications.
    @Test(arguments: availableBackends)
    func pollWithSignalledSource(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            _ = observeAll(loop, log)
            let source = LoopSource { _ in log.append("source") }
            loop.add(source)
            source.signal()
            #expect(loop.run(mode: .default, timeout: .zero, returnAfterSourceHandled: true) == .handledSource)
            #expect(log.all == ["entry", "beforeTimers", "beforeSources", "source", "exit"])
            source.invalidate()
        }
    }

    /// Sleep, wake for a timer, fire it (it stops the loop), exit.
    @Test(arguments: availableBackends)
    func timerWakesTheLoopThenStop(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            _ = observeAll(loop, log)
            let timer = LoopTimer(after: .milliseconds(5)) { _ in
                log.append("timer")
                loop.stop()
            }
            let keepAlive = LoopSource { _ in }
            loop.add(keepAlive)
            loop.add(timer, forMode: .default)
            #expect(loop.run(mode: .default, timeout: .seconds(30)) == .stopped)
            #expect(log.all == ["entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "timer", "exit"])
            keepAlive.invalidate()
        }
    }

    /// Nothing happens: one sleep, then the time limit.
    @Test(arguments: availableBackends)
    func timeoutWithNothingToDo(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            _ = observeAll(loop, log)
            let source = LoopSource { _ in }
            loop.add(source)
            let start = MonotonicClock.now
            #expect(loop.run(mode: .default, timeout: .milliseconds(20)) == .timedOut)
            #expect(start.duration(to: .now) >= .milliseconds(20))
            #expect(log.all == ["entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "exit"])
            source.invalidate()
        }
    }

    /// A source signalled from another thread while the loop sleeps: the
    /// loop wakes, restarts the pass, and fires the source in step 4.
    @Test(arguments: availableBackends)
    func crossThreadSignalRestartsThePass(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            _ = observeAll(loop, log)
            let source = LoopSource { _ in log.append("source") }
            loop.add(source)
            let join = startThread {
                // Once the loop is about to sleep (however late it got
                // there under load): a signal between that note and the
                // kernel wait ends the wait at once, the same sequence.
                while !log.all.contains("beforeWaiting") { usleep(1_000) }
                usleep(5_000)
                source.signal()
            }
            #expect(loop.run(mode: .default, timeout: .seconds(30), returnAfterSourceHandled: true) == .handledSource)
            join()
            #expect(log.all == [
                "entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting",
                "beforeTimers", "beforeSources", "source", "exit",
            ])
            source.invalidate()
        }
    }

    /// A ready descriptor source: step 5 skips the sleep only if it was
    /// already ready; here it becomes ready while the loop sleeps.
    @Test(arguments: availableBackends)
    func descriptorSourceWakesAndFires(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            withPipe { readEnd, writeEnd in
                let log = EventLog()
                _ = observeAll(loop, log)
                let source = LoopSource(descriptor: readEnd) { _, readiness in
                    var byte: UInt8 = 0
                    _ = read(readEnd, &byte, 1)
                    log.append(readiness.contains(.readable) ? "readable" : "other")
                }
                loop.add(source)
                let join = startThread {
                    usleep(20_000)
                    var b: UInt8 = 1
                    _ = write(writeEnd, &b, 1)
                }
                #expect(loop.run(mode: .default, timeout: .seconds(30), returnAfterSourceHandled: true) == .handledSource)
                join()
                #expect(log.all == ["entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "readable", "exit"])
                source.invalidate()
            }
        }
    }
}

@Suite("ThreadLoop: modes, sources, observers")
struct ThreadLoopModeTests {
    /// Events of a source not in the running mode are held until a pass in
    /// its mode.
    @Test(arguments: availableBackends)
    func eventsWaitForTheirMode(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let special: LoopMode = "special"
            let source = LoopSource { _ in log.append("special") }
            let other = LoopSource { _ in }
            loop.add(source, forMode: special)
            loop.add(other, forMode: .default)
            source.signal()
            #expect(loop.run(mode: .default, timeout: .milliseconds(10)) == .timedOut)
            #expect(log.all.isEmpty, "held while running in default")
            #expect(loop.run(mode: special, timeout: .zero, returnAfterSourceHandled: true) == .handledSource)
            #expect(log.all == ["special"])
            source.invalidate()
            other.invalidate()
        }
    }

    @Test(arguments: availableBackends)
    func commonModesReachModesThatJoinLater(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let source = LoopSource { _ in log.append("fired") }
            loop.add(source, forMode: .common)
            #expect(loop.contains(source, inMode: .default))
            let late: LoopMode = "late"
            #expect(!loop.contains(source, inMode: late))
            loop.addCommonMode(late)
            #expect(loop.contains(source, inMode: late))
            #expect(loop.commonModes == [.default, late])
            source.signal()
            #expect(loop.run(mode: late, timeout: .zero, returnAfterSourceHandled: true) == .handledSource)
            #expect(log.all == ["fired"])
            loop.remove(source, forMode: .common)
            #expect(!loop.contains(source, inMode: .default) && !loop.contains(source, inMode: late))
        }
    }

    @Test(arguments: availableBackends)
    func sourcesFireInOrderAndCallbacksRun(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let b = LoopSource(order: 2, schedule: { _, m in log.append("schedule b \(m)") }, cancel: { _, m in log.append("cancel b \(m)") }) { _ in log.append("b") }
            let a = LoopSource(order: 1) { _ in log.append("a") }
            loop.add(b)
            loop.add(a)
            b.signal()
            a.signal()
            #expect(loop.run(mode: .default, timeout: .zero) == .timedOut)
            #expect(log.all == ["schedule b default", "a", "b"])
            b.invalidate()
            #expect(log.all.last == "cancel b default")
            #expect(!b.isValid)
            a.invalidate()
            // Removing what was never added is a no-op.
            loop.remove(LoopSource { _ in }, forMode: .default)
        }
    }

    @Test(arguments: availableBackends)
    func observersRunInOrderAndOneShotsOnce(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            loop.add(LoopObserver(activities: .entry, order: 5) { _, _ in log.append("late") })
            loop.add(LoopObserver(activities: .entry, order: -5) { _, _ in log.append("early") })
            let once = LoopObserver(activities: [.entry], repeats: false) { _, _ in log.append("once") }
            loop.add(once)
            let source = LoopSource { _ in }
            loop.add(source)
            loop.run(mode: .default, timeout: .zero)
            loop.run(mode: .default, timeout: .zero)
            #expect(log.all == ["early", "once", "late", "early", "late"])
            #expect(!once.isValid)
            source.invalidate()
        }
    }

    /// A run nested inside a source handler, in the outer mode and in another.
    @Test(arguments: availableBackends)
    func nestedRuns(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let inner = LoopSource { _ in log.append("inner") }
            let innerMode: LoopMode = "inner"
            loop.add(inner, forMode: innerMode)
            let sameMode = LoopSource { _ in log.append("same") }
            loop.add(sameMode)
            let outer = LoopSource { _ in
                log.append("outer")
                inner.signal()
                #expect(loop.run(mode: innerMode, timeout: .zero, returnAfterSourceHandled: true) == .handledSource)
                sameMode.signal()
                #expect(loop.run(mode: .default, timeout: .zero, returnAfterSourceHandled: true) == .handledSource)
            }
            loop.add(outer)
            outer.signal()
            #expect(loop.run(mode: .default, timeout: .zero, returnAfterSourceHandled: true) == .handledSource)
            #expect(log.all == ["outer", "inner", "same"])
            for s in [inner, sameMode, outer] { s.invalidate() }
        }
    }

    /// The guide's command-buffer input source (Figure 3-2): the worker's
    /// loop owns a source with a command buffer; scheduling registers it with
    /// a client (the "application delegate"); the client posts commands,
    /// signals and wakes the loop; invalidation unregisters it.
    @Test(arguments: availableBackends)
    func commandBufferInputSource(kind: EventBackendKind) {
        final class CommandSource: @unchecked Sendable {
            // @unchecked: `commands` is guarded by `lock`.
            let lock = Lock()
            var commands: [(Int, String)] = []
            var source: LoopSource!
            let processed = EventLog()
            init(client: Client) {
                source = LoopSource(
                    schedule: { [unowned client] loop, _ in client.register(self, loop) },
                    cancel: { [unowned client] _, _ in client.unregister(self) },
                    perform: { [unowned self] _ in self.fire() })
            }
            func add(_ command: Int, _ data: String) { lock.withLock { commands.append((command, data)) } }
            func fire() {
                let batch = lock.withLock { defer { commands.removeAll() }; return commands }
                for (c, d) in batch { processed.append("\(c):\(d)") }
            }
        }
        final class Client: @unchecked Sendable {
            // @unchecked: `registered` is guarded by `lock`.
            let lock = Lock()
            var registered: [(CommandSource, ThreadLoop)] = []
            func register(_ s: CommandSource, _ l: ThreadLoop) { lock.withLock { registered.append((s, l)) } }
            func unregister(_ s: CommandSource) { lock.withLock { registered.removeAll { $0.0 === s } } }
            func send(_ command: Int, _ data: String) {
                for (s, _) in lock.withLock({ registered }) {
                    s.add(command, data)
                    s.source.signal()  // also wakes the loop; wakeUp() is harmless
                }
            }
        }
        let client = Client()
        let ready = EventLog()
        let done = EventLog()
        onLoopThread(kind) { loop in
            let commands = CommandSource(client: client)
            loop.add(commands.source)
            #expect(client.lock.withLock { client.registered.count } == 1)
            let sender = startThread {
                client.send(1, "one")
                client.send(2, "two")
                client.lock.withLock { client.registered }.first?.1.wakeUp()
                ready.append("sent")
            }
            let deadline = MonotonicClock.now.advanced(by: .seconds(30))
            while commands.processed.all.count < 2 && MonotonicClock.now < deadline {
                loop.run(mode: .default, timeout: .milliseconds(100), returnAfterSourceHandled: true)
            }
            sender()
            #expect(commands.processed.all == ["1:one", "2:two"])
            commands.source.invalidate()
            #expect(client.lock.withLock { client.registered.isEmpty }, "cancel unregistered the source")
            done.append("ok")
        }
        #expect(done.all == ["ok"])
    }
}
