import pytest
import torch

from gradwire.errors import GradwireError
from gradwire.models import MODELS, build_model, num_parameters, resnet20, resnet50, vgg16


def _input(name: str, n: int = 3) -> torch.Tensor:
    spec = MODELS[name]
    if spec.data == "text":
        return torch.randint(0, 50, (n, 12))
    return torch.rand(n, *spec.input_shape)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_maps_a_batch_to_one_score_per_class(name):
    text = MODELS[name].data == "text"
    classes = 50 if text else 10
    x = _input(name)
    out = build_model(name, seed=0, classes=classes).eval()(x)
    # Text models predict the next symbol at every position of every sequence.
    assert out.shape == ((*x.shape, classes) if text else (len(x), classes))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["mlp-small", "resnet20", "lstm"])
def test_the_same_seed_builds_the_same_model(name):
    a, b, c = (build_model(name, s) for s in (3, 3, 4))
    sa, sb, sc = (m.state_dict() for m in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_parameter_counts_match_the_papers():
    # torchvision's resnet50 and the gTop-k paper's m: 25.6 M at ImageNet width.
    assert num_parameters(resnet50()) == 25_557_032
    # He et al. 2016, Table 6: ResNet-20 has 0.27 M.
    assert 0.26e6 < num_parameters(resnet20(10, 3)) < 0.28e6
    # VGG-16's thirteen convolutions hold 14.7 M; the 512-512-10 classifier adds 0.53 M.
    assert num_parameters(vgg16(10, 3, 32, batch_norm=False)) == 14_714_688 + 530_442
    assert num_parameters(build_model("mlp")) == 1_126_410


def test_resnet50_takes_imagenet_images_and_small_ones():
    assert resnet50(classes=7).eval()(torch.rand(1, 3, 64, 64)).shape == (1, 7)
    small = resnet50(classes=10, in_channels=1, small_input=True).eval()
    assert small(torch.rand(2, 1, 8, 8)).shape == (2, 10)
    # The stem is the only difference: a 3x3 instead of a 7x7 kernel over one channel.
    assert num_parameters(resnet50(10, 1)) - num_parameters(small) == (49 - 9) * 64


def test_unknown_model_says_what_is_allowed():
    with pytest.raises(GradwireError, match=r"unknown model 'resnet18' \(did you mean "
                       r"'resnet[25]0'\?\): expected one of mlp"):
        build_model("resnet18")
    with pytest.raises(GradwireError, match="unknown model 'xyz': expected one of mlp"):
        build_model("xyz")
