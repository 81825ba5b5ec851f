import threading, pytest, torch, torch_npu

def test_side_stream_backward(npugraph):
    x = torch.randn(4, 4, device="npu", requires_grad=True)
    w = torch.randn(4, 4, device="npu", requires_grad=True)
    main_thread = threading.get_ident()
    seen = []
    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a): return a.clone()
        @staticmethod
        def backward(ctx, g):
            seen.append((threading.get_ident() == main_thread, torch.npu.current_stream()))
            return g
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        loss = (Spy.apply(x) @ w).sum()
        loss.backward()
    torch.npu.current_stream().wait_stream(s)
    z = x.grad * 2
    print(seen)
    assert torch.allclose(z.cpu(), 2 * w.cpu().sum(1).expand(4, 4))
