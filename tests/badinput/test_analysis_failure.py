"""An analysis that raises fails the test loudly, with its own traceback, and never hides the hazards
the other analyses found."""


def test_a_failing_analysis_fails_the_test_and_keeps_the_race_report(pytester):
    pytester.makeconftest("""
        from pytest_npugraph import analysis

        def broken(trace, cache):
            raise ZeroDivisionError("boom in the broken analysis")

        broken.__qualname__ = "broken_analysis"
        analysis.REGISTRY.append((None, broken))
    """)
    pytester.makepyfile("""
        import torch, torch_npu

        def test_racy(npugraph):
            x = torch.ones(64, device="npu")
            side = torch.npu.Stream()
            with torch.npu.stream(side):
                x.add_(1)                      # no wait: a race with the fill on the default stream

        def test_clean_but_analysis_breaks(npugraph):
            torch.ones(4, device="npu") + 1

        def test_assert_clean_raises(npugraph):
            torch.ones(4, device="npu") + 1
            npugraph.assert_clean()
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "*analysis(es) failed on this test's trace*broken_analysis*",
        "*ZeroDivisionError: boom in the broken analysis*",
    ])
    out = result.stdout.str()
    assert "--- 1. race ---" in out                 # the race is still reported
    assert out.count("boom in the broken analysis") >= 3
