"""The odmap Space's app: evaluate's metric widget for odmap.py beside it, plus NLTK's tagger
data, which the widget's caption texts need and a fresh Space lacks (downloaded once when the app
starts)."""

import os

import evaluate
import nltk
from evaluate.utils import launch_gradio_widget

try:
    nltk.data.find("taggers/averaged_perceptron_tagger_eng/")
except LookupError:
    nltk.download("averaged_perceptron_tagger_eng", quiet=True)
module = evaluate.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "odmap.py"))
launch_gradio_widget(module)
