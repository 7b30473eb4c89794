"""One rank of test_distributed.py's runs (started by torch.distributed.run):
trains a ResNet-18 (BasicBlocks 2-2-2-2, 32x32 inputs, built here so that
no torchvision is needed) for 20 steps, the original and its converted
copy from the same weights and batches, under DDP or FSDP2, and writes the
losses and any gradient-stride warnings (rank 0) to a JSON file.

    python -m torch.distributed.run --nproc-per-node 2 tests/distributed_worker.py \
        {ddp,fsdp2} OUT.json
"""
import copy
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

import conv2d_ext

STEPS = 20


class Block(nn.Module):
    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      norm(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet18(norm, classes=10):
    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), norm(64), nn.ReLU()]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [Block(cin, cout, stride, norm), Block(cout, cout, 1, norm)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def train(model, mode, rank):
    # DDP with channels_last parameters (its gradient buckets need the
    # gradients' strides to match); FSDP2 shards only contiguous parameters.
    layout = torch.channels_last if mode == "ddp" else torch.contiguous_format
    model = model.cuda().to(memory_format=layout)
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for module in model.modules():
            if isinstance(module, Block):
                fully_shard(module, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    # GroupNorm under bfloat16 parameters (FSDP2's run) diverged at DDP's
    # rate and its losses still jumped at a seventh of it.
    opt = torch.optim.SGD(model.parameters(), lr=0.02 if mode == "ddp" else 0.001, momentum=0.9)
    # One batch per rank, learned by heart: the loss must fall.
    g = torch.Generator(device="cuda").manual_seed(100 + rank)
    x = torch.randn(16, 3, 32, 32, device="cuda", generator=g).to(memory_format=layout)
    target = torch.randint(0, 10, (16,), device="cuda", generator=g)
    losses = []
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(model(x).float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses


def main():
    mode, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    # Under FSDP2's bfloat16 parameters BatchNorm's float32 running
    # statistics fail its backward ("Expected running_mean to have type
    # BFloat16"), in the original model as much as the converted one: that
    # run uses GroupNorm.
    norm = nn.BatchNorm2d if mode == "ddp" else (lambda c: nn.GroupNorm(8, c))
    original = resnet18(norm)
    converted = conv2d_ext.convert(copy.deepcopy(original))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = {"original": train(original, mode, rank),
                  "converted": train(converted, mode, rank)}
    result["stride_warnings"] = [str(w.message) for w in caught if "stride" in str(w.message)]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast
    main()
