"""Package data: the hand-tagged caption corpus the offline NLTK tagger is trained on."""
