"""clockq's load predictor: load history, forecasting models, their offline evaluation and the
controller that turns a forecast into control state.

Importing this package (or `predictor.series`, `predictor.evaluation`) never imports TensorFlow:
only the code that trains or serves the LSTM does, lazily, inside the functions that need it.
The web process, beat and the GPU workers load this app and must stay free of TensorFlow.
"""
