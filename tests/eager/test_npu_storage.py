"""Storages made directly on the npu device: torch asks PrivateUse1's C++ allocator, which the emulated
(Python) backend cannot register; the request must be a clear error, never a crash of the process."""


def test_an_npu_storage_is_refused_with_an_error_not_a_segfault(pytester):
    pytester.makepyfile(test_storage="""
        import pytest, torch, torch_npu

        def test_untyped(npugraph):
            with pytest.raises(RuntimeError, match="UntypedStorage.*device='npu'.*is not emulated"):
                torch.UntypedStorage(64, device="npu")
            with pytest.raises(RuntimeError, match="is not emulated"):
                torch.UntypedStorage(64, device=torch.device("npu", 0))

        def test_typed(npugraph):
            with pytest.raises(RuntimeError, match="is not emulated"):
                torch.TypedStorage(8, device="npu", dtype=torch.float)

        def test_host_storages_still_work(npugraph):
            assert torch.UntypedStorage(64).size() == 64
            assert torch.UntypedStorage(16, device="cpu").size() == 16
            assert torch.ones(4, device="npu").untyped_storage().nbytes() == 16
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
