import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

@Suite("Topology")
struct TopologyTests {
    @Test func onlineCPUsAreSortedAndIncludeTheCurrentOne() {
        let online = Topology.onlineCPUs
        #expect(!online.isEmpty)
        #expect(online == online.sorted())
        #expect(Set(online).count == online.count)
        #expect(online.count == sysconf(Int32(_SC_NPROCESSORS_ONLN)))
        if let cpu = Topology.currentCPU { #expect(online.contains(cpu)) }
    }

    @Test func everyOnlineCPUIsOnExactlyOneNode() {
        let nodes = Topology.numaNodes
        #expect(nodes.contains { $0.id == 0 }, "node 0 always exists")
        #expect(Topology.numaNodeIDs == nodes.map(\.id).sorted())
        let cpus = nodes.flatMap(\.cpus)
        #expect(Set(cpus).count == cpus.count, "no CPU on two nodes")
        #expect(Set(cpus) == Set(Topology.onlineCPUs))
        if !Topology.isNUMAAvailable { #expect(nodes.count == 1) }
    }

    @Test func nodeOfCPU() throws {
        for node in Topology.numaNodes {
            for cpu in node.cpus { #expect(try Topology.node(ofCPU: cpu) == node.id) }
        }
        #expect(throws: NativeThreadError.cpuOutOfRange(cpu: 4096, online: Topology.onlineCPUs)) {
            try Topology.node(ofCPU: 4096)
        }
    }

    @Test func sizesArePlausible() {
        let line = Topology.cacheLineSize
        #expect(line >= 16 && line <= 512 && line & (line - 1) == 0)
        let page = Topology.pageSize
        #expect(page >= 4096 && page & (page - 1) == 0)
        #expect(Topology.minimumStackSize >= 16 << 10)
        #expect(Topology.defaultStackSize >= Topology.minimumStackSize)
    }

    @Test func nodeLocalMemoryIsUsableAndFreed() throws {
        let size = (1 << 20) + 123
        let memory = try Topology.allocate(byteCount: size, onNode: 0)
        #expect(memory.count == size)
        #expect(Int(bitPattern: memory.baseAddress) % Topology.pageSize == 0)
        #expect(memory[0] == 0 && memory[size - 1] == 0, "fresh pages are zeroed")
        memory[0] = 0xAB
        memory[size - 1] = 0xCD
        #expect(memory[0] == 0xAB && memory[size - 1] == 0xCD)
        Topology.deallocate(memory)
    }

    @Test func memoryOnANodeThatDoesNotExistThrows() {
        #expect(throws: NativeThreadError.numaNodeOutOfRange(node: 7, available: Topology.numaNodeIDs)) {
            _ = try Topology.allocate(byteCount: 4096, onNode: 7)
        }
        #expect(throws: NativeThreadError.numaNodeOutOfRange(node: -1, available: Topology.numaNodeIDs)) {
            _ = try Topology.allocate(byteCount: 4096, onNode: -1)
        }
    }

    @Test func aThreadCanBindItselfToANode() throws {
        let node = Topology.numaNodes[0]
        let thread = try NativeThread.start { () throws -> Set<Int> in
            try NativeThread.current.bindToNUMANode(node.id)
            return try NativeThread.current.affinity()
        }
        #expect(try thread.join() == Set(node.cpus))
        let missing = try NativeThread.start { () -> NativeThreadError? in
            do throws(NativeThreadError) {
                try NativeThread.current.bindToNUMANode(7)
                return nil
            } catch {
                return error
            }
        }
        #expect(try missing.join() == .numaNodeOutOfRange(node: 7, available: Topology.numaNodeIDs))
    }

    @Test func allocatingNothingIsMisuse() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = try? Topology.allocate(byteCount: 0, onNode: 0)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("Topology.allocate(byteCount:onNode:): `byteCount` is 0"))
    }

    @Test func cgroupCPUMaxIsReadAsWholeCPUsRoundedUp() {
        #expect(Topology.cpuCount(fromCPUMax: "max 100000\n") == nil)
        #expect(Topology.cpuCount(fromCPUMax: "150000 100000\n") == 2)
        #expect(Topology.cpuCount(fromCPUMax: "50000 100000") == 1)
        #expect(Topology.cpuCount(fromCPUMax: "400000 100000") == 4)
        #expect(Topology.cpuCount(fromCPUMax: "garbage") == nil)
    }

    @Test func availableCPUCountIsWithinTheOnlineCPUs() {
        #expect(Topology.availableCPUCount >= 1)
        #expect(Topology.availableCPUCount <= Topology.onlineCPUs.count)
    }

    /// In a child process whose main thread may use one CPU only: the pool
    /// is one worker wide, and still runs items that wait for later ones.
    @Test(.enabled(if: Topology.onlineCPUs.count > 1, "one CPU: nothing to narrow"))
    func availableCPUCountFollowsTheProcessAffinity() async {
        await #expect(processExitsWith: .success) {
            guard let first = Topology.onlineCPUs.first,
                  (try? NativeThread.main.setAffinity([first])) != nil
            else { exit(2) }
            guard Topology.availableCPUCount == 1, WorkQueue.poolWidth == 1 else { exit(3) }
            let gate = Semaphore(value: 0)
            let group = WorkGroup()
            WorkQueue.global().async(group: group) { gate.wait() }
            WorkQueue.global().async(group: group) { _ = gate.signal() }
            exit(try await group.wait(timeout: .seconds(30)) == .completed ? 0 : 4)
        }
    }
}
