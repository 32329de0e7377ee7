"""eBPF sources (bcc), one module per job: :mod:`.loader` (the shared pre-checks and the trial
child that picks each hook's variant), :mod:`.source` (:class:`EbpfSource`: load the program,
deliver its ring buffer), :mod:`.netns` (netns offsets and filter), and one module per probe with
its hook specs: :mod:`.carrier`, :mod:`.tcp`, :mod:`.rdma`."""
