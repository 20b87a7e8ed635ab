"""The accounting against transformers itself: the same config built on the meta device (no download, no memory), counted.

Runs where transformers is installed (`tox -e external`, or `pip install -e ".[external]"`); skipped with the reason elsewhere.
"""

import pytest
from hypothesis import HealthCheck, given, settings

import invariants.accounting
from invariants.accounting import model_from_config, param_count, read_config, tensor_shapes
from invariants.accounting.strategies import model_configs

torch = pytest.importorskip("torch", reason="the comparison builds transformers models; torch is not installed")
transformers = pytest.importorskip("transformers", reason="the comparison builds transformers' own models; transformers is not installed "
                                                          "(pip install -e '.[external]')")
transformers.logging.set_verbosity_error()  # tiny drawn vocabularies make it warn about GPT-2's special-token ids

COMPARED = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def built(config):
    """transformers' model for config, on the meta device: {parameter name: shape}, a tied head listed once.

    For Gemma 3's multimodal config, its text part: Gemma3ForConditionalGeneration without the vision tower and the
    projector, named as Gemma3ForCausalLM names them.
    """
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    if config["model_type"] != "gemma3":
        return shapes
    vision = ("model.vision_tower.", "model.multi_modal_projector.")
    return {name.replace("model.language_model.", "model."): shape for name, shape in shapes.items() if not name.startswith(vision)}


def as_transformers_builds_it(config):
    """config without the lesson's GPT-2 attention_bias switch, which transformers ignores (its GPT-2 always has the biases)."""
    if config["model_type"] == "gpt2":
        return {key: value for key, value in config.items() if key != "attention_bias"}
    return config


@pytest.mark.parametrize("name", invariants.accounting.known_models())
def test_known_model_counts_equal_transformers(name):
    config = read_config(name)
    shapes = built(as_transformers_builds_it(config))
    total = sum(_size(shape) for shape in shapes.values())
    assert param_count(as_transformers_builds_it(config)).total == total
    if name == "tinygpt":  # the lesson's model has no attention biases: 4d per block fewer than transformers' GPT-2
        m = model_from_config(config)
        assert total - param_count(config).total == 4 * m.d_model * m.n_layers


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")  # a DeepSeek layer with no shared experts
@COMPARED
@given(model_configs(lesson_keys=False))
def test_drawn_configs_have_the_tensors_transformers_builds(config):
    """Every tensor, named and shaped as transformers builds it from the same config.json, defaults included."""
    ours = {t.name: t.shape for t in tensor_shapes(model_from_config(config))}
    assert ours == built(config), config


def _size(shape):
    n = 1
    for s in shape:
        n *= s
    return n
