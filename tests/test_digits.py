"""vtakit.digits: the shipped 8×8 digits CNN, its data, and the numpy training code."""

import sys

import numpy as np
import pytest
from ort_reference import reference_session

from vtakit import digits, models


@pytest.fixture(scope="module")
def test_data():
    return digits.test_split()


@pytest.fixture(scope="module")
def ort_logits(test_data):
    pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")
    sess = reference_session(digits.load_model())
    return sess.run(None, {"input": test_data[0]})[0]


def test_loaders_shapes_and_dtypes(test_data):
    x, y = test_data
    assert x.shape == (360, 1, 8, 8) and x.dtype == np.float32
    assert y.shape == (360,) and y.dtype == np.int64
    assert 0 <= x.min() and x.max() <= 1 and set(y) == set(range(10))
    calib = digits.calibration_set()
    assert calib.shape == (64, 1, 8, 8) and calib.dtype == np.float32
    assert digits.model_path().is_file()
    model = digits.load_model()
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == "input" and out.name == "logits"
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims == ["N", 1, 8, 8]


def test_preprocess():
    raw = np.array([[0, 8, 16, 4] * 16], np.uint8)
    x = digits.preprocess(raw)
    assert x.shape == (1, 1, 8, 8) and x.dtype == np.float32
    np.testing.assert_array_equal(x.ravel()[:4], [0, 0.5, 1, 0.25])
    with pytest.raises(ValueError, match=r"whole 8×8 images, got an array of shape \(63,\)"):
        digits.preprocess(np.zeros(63))
    with pytest.raises(ValueError, match=r"expected raw pixels in 0..16, got values in 0..17"):
        digits.preprocess(np.arange(64) % 18)


def test_shipped_model_accuracy_onnxruntime(test_data, ort_logits):
    assert (ort_logits.argmax(1) == test_data[1]).mean() >= 0.97


def test_shipped_model_accuracy_compiled_cpu(test_data, ort_logits):
    from vtakit.compiler import compile_model
    from vtakit.runtime import InferenceSession

    x, y = test_data
    # A small batch: the session's set-up time grows with the batch, its run time hardly.
    batch = 8
    sess = InferenceSession(compile_model(digits.load_model(), batch_size=batch))
    logits = np.concatenate([sess.run(None, {"input": x[i:i + batch]})[0]
                             for i in range(0, len(x), batch)])
    assert (logits.argmax(1) == y).mean() >= 0.97
    np.testing.assert_array_equal(logits.argmax(1), ort_logits.argmax(1))
    np.testing.assert_allclose(logits, ort_logits, rtol=1e-4, atol=1e-4)


def test_export_matches_numpy_forward(test_data):
    pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")
    layers = digits.build(seed=3)
    x = test_data[0][:32]
    sess = reference_session(digits.to_onnx(layers))
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], digits.forward(layers, x),
                               rtol=1e-4, atol=1e-5)


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    layers = digits.build(seed=1, image_size=4, channels=(2, 3, 2), hidden=5, classes=3,
                          dtype=np.float64)
    for layer in layers:  # nonzero biases, so that their gradients are exercised too
        for k in layer.params:
            layer.params[k] += rng.standard_normal(layer.params[k].shape) * 0.1
    x, y = rng.standard_normal((3, 1, 4, 4)), np.array([0, 2, 1])

    def loss():
        return digits.softmax_cross_entropy(digits.forward(layers, x), y)[0]

    digits.backward(layers, digits.softmax_cross_entropy(digits.forward(layers, x), y)[1])
    grads = [{k: g.copy() for k, g in layer.grads.items()} for layer in layers]
    eps, checked = 1e-6, 0
    for layer, grad in zip(layers, grads):
        for k, p in layer.params.items():
            for idx in map(tuple, rng.integers(0, p.shape, (3, p.ndim))):
                saved = p[idx]
                p[idx] = saved + eps
                up = loss()
                p[idx] = saved - eps
                down = loss()
                p[idx] = saved
                np.testing.assert_allclose(grad[k][idx], (up - down) / (2 * eps),
                                           rtol=1e-5, atol=1e-8, err_msg=f"{layer} {k}{idx}")
                checked += 1
    assert checked == 3 * 2 * 5  # three convolutions and two dense layers, w and b each


def test_one_short_epoch_lowers_the_loss(test_data):
    x, y = test_data[0][:96], test_data[1][:96]
    layers = digits.build(seed=0)

    def loss():
        return digits.softmax_cross_entropy(digits.forward(layers, x), y)[0]

    before = loss()
    losses = digits.train(layers, x, y, epochs=1, batch_size=16, lr=3e-3, seed=0)
    assert len(losses) == 1
    assert loss() < 0.8 * before


def test_training_without_sklearn_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes `import sklearn...` fail
    with pytest.raises(ImportError, match=r"needs scikit-learn .*pip install scikit-learn"):
        digits.train_and_export(tmp_path)
    assert not list(tmp_path.iterdir())


def test_untrained_model_in_models():
    assert models.digits_cnn(seed=1) == models.digits_cnn(seed=1)
    assert models.digits_cnn(seed=1) != models.digits_cnn(seed=2)
    ops = [n.op_type for n in models.digits_cnn().graph.node]
    assert ops == ["Conv", "Relu", "Conv", "Relu", "MaxPool", "Conv", "Relu", "Flatten", "Gemm",
                   "Relu", "Gemm"]
